// Status: the outcome of an operation in Ember's core.  The core never
// throws; every fallible function returns Status or Result<T> (result.h).
//
// A Status is OK or carries a code and a message.  Messages name what failed
// (node, host, file, offset, column) and, where it helps, what to do.
// Status is a value type: cheap to copy when OK, thread-compatible.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>

namespace ember {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,   // the caller passed something wrong
  kNotFound = 2,
  kAlreadyExists = 3,
  kDeadlineExceeded = 4,  // a wait ran out of time
  kUnavailable = 5,       // a peer cannot be reached
  kUnauthenticated = 6,   // a peer did not prove the job's secret
  kAborted = 7,           // the job was aborted (a node failed, or the driver stopped it)
  kIOError = 8,           // the OS said no
  kCorruption = 9,        // malformed bytes from a file or the network
  kOutOfRange = 10,       // end of data
  kCancelled = 11,
  kInternal = 12,         // a bug in Ember
};

// Short name of a code, e.g. "DeadlineExceeded".
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status AlreadyExists(std::string msg) { return {StatusCode::kAlreadyExists, std::move(msg)}; }
  static Status DeadlineExceeded(std::string msg) { return {StatusCode::kDeadlineExceeded, std::move(msg)}; }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status Unauthenticated(std::string msg) { return {StatusCode::kUnauthenticated, std::move(msg)}; }
  static Status Aborted(std::string msg) { return {StatusCode::kAborted, std::move(msg)}; }
  static Status IOError(std::string msg) { return {StatusCode::kIOError, std::move(msg)}; }
  static Status Corruption(std::string msg) { return {StatusCode::kCorruption, std::move(msg)}; }
  static Status OutOfRange(std::string msg) { return {StatusCode::kOutOfRange, std::move(msg)}; }
  static Status Cancelled(std::string msg) { return {StatusCode::kCancelled, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
  // IOError from errno, e.g. FromErrno(errno, "connect to 10.0.0.1:7077").
  static Status FromErrno(int err, std::string_view context);

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  const std::string& message() const;
  // "DeadlineExceeded: <message>", or "OK".
  std::string ToString() const;

  // Returns a copy with `context + ": "` prepended to the message.
  Status WithContext(std::string_view context) const;

  bool operator==(const Status& other) const {
    return code() == other.code() && message() == other.message();
  }

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  std::shared_ptr<const State> state_;  // null when OK; immutable once made
};

// Ends the process, printing `status` to stderr: a Result's value was taken
// although it held none (ember/result.h), a programming error.
[[noreturn]] void ResultValueMissing(const Status& status);

}  // namespace ember

// Returns early from the calling function if `expr` is not OK.
#define EMBER_RETURN_NOT_OK(expr)            \
  do {                                       \
    ::ember::Status _st = (expr);            \
    if (!_st.ok()) return _st;               \
  } while (0)
