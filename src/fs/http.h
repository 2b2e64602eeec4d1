// HttpClient: one libcurl easy handle, reused across requests so the TCP
// connection to a server stays open (keep-alive).  The HTTP layer of the
// WebHDFS file system (webhdfs.cc); no WebHDFS knowledge here.
//
// Thread safety: an HttpClient is used by one thread at a time (libcurl's
// rule for an easy handle); HttpClientPool hands them out to many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "ember/fs.h"
#include "ember/result.h"

namespace ember::fs::internal {

struct HttpTimeouts {
  Duration connect{30000};  // one TCP connect
  Duration io{120000};      // no byte moving in either direction for this long
};

struct HttpResponse {
  long status = 0;       // HTTP status code
  std::string location;  // the Location header of a redirect, else empty
  std::string body;      // the body, unless the request wrote it into a sink
  size_t sink_bytes = 0; // bytes written into the request's sink
};

enum class HttpMethod { kGet, kPut, kPost, kDelete };
const char* HttpMethodName(HttpMethod m);

class HttpClient {
 public:
  // Fails only if libcurl cannot make a handle (out of memory).
  static Result<std::unique_ptr<HttpClient>> Make(HttpTimeouts timeouts);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Sends one request to `url` and returns the response; redirects are not
  // followed unless `follow_redirects`.  `body` is sent as the request body
  // (PUT/POST; an empty body is sent as Content-Length: 0).  When `sink` is
  // given the response body of a 2xx answer goes into it (at most
  // sink.size() bytes; more is an IOError) instead of HttpResponse::body.
  // Errors: Unavailable when the server cannot be reached (refused, no such
  // host, connect timeout), DeadlineExceeded when a request makes no
  // progress for the I/O timeout, IOError otherwise; each names the method
  // and URL.  A non-2xx status is not an error here.
  Result<HttpResponse> Send(HttpMethod method, const std::string& url,
                            std::span<const uint8_t> body = {},
                            std::span<uint8_t> sink = {}, bool follow_redirects = false);

 private:
  HttpClient(void* curl, HttpTimeouts timeouts) : curl_(curl), timeouts_(timeouts) {}
  void* curl_;  // CURL*; owned
  HttpTimeouts timeouts_;
};

// Idle HttpClients for requests made from many threads at once; a client
// taken is given back when its Lease ends, keeping its connection warm.
class HttpClientPool {
 public:
  explicit HttpClientPool(HttpTimeouts timeouts) : timeouts_(timeouts) {}

  class Lease {
   public:
    Lease(HttpClientPool* pool, std::unique_ptr<HttpClient> c) : pool_(pool), client_(std::move(c)) {}
    ~Lease() { pool_->Return(std::move(client_)); }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    HttpClient* operator->() { return client_.get(); }

   private:
    HttpClientPool* pool_;
    std::unique_ptr<HttpClient> client_;
  };

  // An idle client, or a new one.  Thread-safe.
  Result<std::unique_ptr<Lease>> Take();

 private:
  void Return(std::unique_ptr<HttpClient> client);

  const HttpTimeouts timeouts_;
  Mutex mu_;
  std::vector<std::unique_ptr<HttpClient>> idle_ GUARDED_BY(mu_);
};

// Percent-encodes `s` for a URL, keeping RFC 3986's unreserved characters
// and, when `keep_slash`, '/'.
std::string UrlEncode(const std::string& s, bool keep_slash);

}  // namespace ember::fs::internal
