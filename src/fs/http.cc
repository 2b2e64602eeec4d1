// libcurl easy-handle wrapper; see http.h.
#include "fs/http.h"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <mutex>

namespace ember::fs::internal {
namespace {

// curl_global_init is not thread-safe and must run before any handle is
// made; once per process, never cleaned up (handles may live until exit).
Status GlobalInit() {
  static std::once_flag once;
  static CURLcode rc = CURLE_OK;
  std::call_once(once, [] { rc = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (rc != CURLE_OK) return Status::Internal(std::string("curl_global_init: ") + curl_easy_strerror(rc));
  return Status::OK();
}

constexpr size_t kMaxErrorBody = 64 << 10;  // enough for any RemoteException

struct WriteContext {
  CURL* curl;
  std::string* body;
  std::span<uint8_t> sink;
  size_t sink_bytes = 0;
  bool overflow = false;
};

size_t WriteCallback(char* data, size_t size, size_t nmemb, void* userp) {
  auto* ctx = static_cast<WriteContext*>(userp);
  const size_t n = size * nmemb;
  long code = 0;
  curl_easy_getinfo(ctx->curl, CURLINFO_RESPONSE_CODE, &code);
  if (!ctx->sink.empty() && code >= 200 && code < 300) {
    if (n > ctx->sink.size() - ctx->sink_bytes) {
      ctx->overflow = true;
      return 0;  // aborts the transfer with CURLE_WRITE_ERROR
    }
    std::memcpy(ctx->sink.data() + ctx->sink_bytes, data, n);
    ctx->sink_bytes += n;
    return n;
  }
  if (ctx->body->size() < kMaxErrorBody || ctx->sink.empty()) ctx->body->append(data, n);
  return n;
}

}  // namespace

const char* HttpMethodName(HttpMethod m) {
  switch (m) {
    case HttpMethod::kGet: return "GET";
    case HttpMethod::kPut: return "PUT";
    case HttpMethod::kPost: return "POST";
    case HttpMethod::kDelete: return "DELETE";
  }
  return "?";
}

Result<std::unique_ptr<HttpClient>> HttpClient::Make(HttpTimeouts timeouts) {
  EMBER_RETURN_NOT_OK(GlobalInit());
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return Status::Internal("curl_easy_init failed");
  return std::unique_ptr<HttpClient>(new HttpClient(curl, timeouts));
}

HttpClient::~HttpClient() { curl_easy_cleanup(static_cast<CURL*>(curl_)); }

Result<HttpResponse> HttpClient::Send(HttpMethod method, const std::string& url,
                                      std::span<const uint8_t> body, std::span<uint8_t> sink,
                                      bool follow_redirects) {
  CURL* curl = static_cast<CURL*>(curl_);
  // Reset drops the previous request's options but keeps the connection cache.
  curl_easy_reset(curl);
  HttpResponse response;
  WriteContext ctx{curl, &response.body, sink};
  char error[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // no SIGALRM: we run in threads
  curl_easy_setopt(curl, CURLOPT_PROXY, "");      // no proxy from the environment: config comes in options
  curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &WriteCallback);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &ctx);
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(std::max<int64_t>(1, timeouts_.connect.count())));
  // "No progress for io": fewer than 1 byte/s over io seconds aborts.
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
  curl_easy_setopt(curl, CURLOPT_LOW_SPEED_TIME,
                   static_cast<long>(std::max<int64_t>(1, (timeouts_.io.count() + 999) / 1000)));
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, follow_redirects ? 1L : 0L);
  curl_easy_setopt(curl, CURLOPT_MAXREDIRS, 5L);
  struct curl_slist* headers = nullptr;
  if (method == HttpMethod::kPut || method == HttpMethod::kPost) {
    // The body from memory, no copy; "Expect:" off so a large body is not
    // held back a second waiting for "100 Continue".
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.empty() ? "" : reinterpret_cast<const char*>(body.data()));
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    headers = curl_slist_append(headers, "Content-Type: application/octet-stream");
    headers = curl_slist_append(headers, "Expect:");
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, HttpMethodName(method));
  } else if (method == HttpMethod::kDelete) {
    curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, "DELETE");
  } else {
    curl_easy_setopt(curl, CURLOPT_HTTPGET, 1L);
  }
  const CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  const std::string what = std::string(HttpMethodName(method)) + " " + url;
  if (ctx.overflow) {
    return Status::IOError(what + ": the server sent more than the " + std::to_string(sink.size()) +
                           " bytes asked for");
  }
  if (rc != CURLE_OK) {
    const std::string detail = error[0] ? error : curl_easy_strerror(rc);
    curl_off_t connect_us = 0;
    curl_easy_getinfo(curl, CURLINFO_CONNECT_TIME_T, &connect_us);
    switch (rc) {
      case CURLE_COULDNT_CONNECT:
      case CURLE_COULDNT_RESOLVE_HOST:
        return Status::Unavailable(what + ": cannot connect: " + detail);
      case CURLE_OPERATION_TIMEDOUT:
        if (connect_us == 0) {
          return Status::Unavailable(what + ": no connection within " +
                                     std::to_string(timeouts_.connect.count()) + " ms: " + detail);
        }
        return Status::DeadlineExceeded(what + ": no progress for " +
                                        std::to_string(timeouts_.io.count()) + " ms: " + detail);
      default:
        return Status::IOError(what + ": " + detail);
    }
  }
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
  if (!follow_redirects) {
    char* location = nullptr;
    curl_easy_getinfo(curl, CURLINFO_REDIRECT_URL, &location);
    if (location != nullptr) response.location = location;
  }
  response.sink_bytes = ctx.sink_bytes;
  return response;
}

Result<std::unique_ptr<HttpClientPool::Lease>> HttpClientPool::Take() {
  std::unique_ptr<HttpClient> client;
  {
    MutexLock lock(&mu_);
    if (!idle_.empty()) {
      client = std::move(idle_.back());
      idle_.pop_back();
    }
  }
  if (client == nullptr) {
    EMBER_ASSIGN_OR_RAISE(client, HttpClient::Make(timeouts_));
  }
  return std::make_unique<Lease>(this, std::move(client));
}

void HttpClientPool::Return(std::unique_ptr<HttpClient> client) {
  constexpr size_t kMaxIdle = 8;
  MutexLock lock(&mu_);
  if (idle_.size() < kMaxIdle) idle_.push_back(std::move(client));
}

std::string UrlEncode(const std::string& s, bool keep_slash) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.' || c == '~' || (keep_slash && c == '/')) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

}  // namespace ember::fs::internal
