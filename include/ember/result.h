// Result<T>: a value of type T, or the Status saying why there is none.
#pragma once

#include <optional>
#include <utility>

#include "ember/status.h"

namespace ember {

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    if (status_.ok()) status_ = Status::Internal("Result constructed from an OK Status");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  // Precondition: ok().  Breaking it is a programming error, in every build:
  // the process ends with the Status (ResultValueMissing, ember/status.h).
  T& operator*() & { Check(); return *value_; }
  const T& operator*() const& { Check(); return *value_; }
  T* operator->() { Check(); return &*value_; }
  const T* operator->() const { Check(); return &*value_; }
  T MoveValueUnsafe() { Check(); return std::move(*value_); }
  // Returns the value, or `fallback` when not ok().
  T ValueOr(T fallback) const& { return ok() ? *value_ : std::move(fallback); }

 private:
  void Check() const {
    if (!value_.has_value()) [[unlikely]] ResultValueMissing(status_);
  }
  Status status_;  // OK when value_ is set
  std::optional<T> value_;
};

}  // namespace ember

#define EMBER_CONCAT_INNER(a, b) a##b
#define EMBER_CONCAT(a, b) EMBER_CONCAT_INNER(a, b)
#define EMBER_ASSIGN_OR_RAISE_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                               \
  if (!tmp.ok()) return tmp.status();               \
  lhs = tmp.MoveValueUnsafe()
// `lhs = value of rexpr`, or return its Status from the calling function.
#define EMBER_ASSIGN_OR_RAISE(lhs, rexpr) \
  EMBER_ASSIGN_OR_RAISE_IMPL(EMBER_CONCAT(_ember_result_, __COUNTER__), lhs, rexpr)
