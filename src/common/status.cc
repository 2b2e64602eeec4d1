#include "ember/status.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ember {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kDeadlineExceeded: return "DeadlineExceeded";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kUnauthenticated: return "Unauthenticated";
    case StatusCode::kAborted: return "Aborted";
    case StatusCode::kIOError: return "IOError";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kOutOfRange: return "OutOfRange";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string message) {
  // An OK code carries no state, whatever message was passed: OK is OK.
  if (code != StatusCode::kOk) {
    state_ = std::make_shared<const State>(State{code, std::move(message)});
  }
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return state_ ? state_->message : kEmpty;
}

Status Status::FromErrno(int err, std::string_view context) {
  char buf[256];
  // GNU strerror_r returns the message pointer (possibly not buf).
  const char* text = strerror_r(err, buf, sizeof(buf));
  std::string msg(context);
  if (!msg.empty()) msg += ": ";
  msg += text;
  return Status(StatusCode::kIOError, std::move(msg));
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code()));
  out += ": ";
  out += state_->message;
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += state_->message;
  return Status(state_->code, std::move(msg));
}

void ResultValueMissing(const Status& status) {
  std::fprintf(stderr, "ember: a Result's value was taken although it holds none: %s\n", status.ToString().c_str());
  std::abort();
}

}  // namespace ember
