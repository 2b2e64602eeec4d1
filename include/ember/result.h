// Result<T>: a value of type T, or the Status saying why there is none.
#pragma once

#include <cassert>
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

  // Precondition: ok().
  T& operator*() & { assert(ok()); return *value_; }
  const T& operator*() const& { assert(ok()); return *value_; }
  T* operator->() { assert(ok()); return &*value_; }
  const T* operator->() const { assert(ok()); return &*value_; }
  T MoveValueUnsafe() { assert(ok()); return std::move(*value_); }
  // Returns the value, or `fallback` when not ok().
  T ValueOr(T fallback) const& { return ok() ? *value_ : std::move(fallback); }

 private:
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
