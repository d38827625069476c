// Result<T>: a value or a one-line error a user can act on, returned across library boundaries.
// Owns no I/O; never exits. Safe to pass between threads like any value type.
// (std::expected is C++23; this is the small subset memwall needs under C++20.)
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace memwall {

struct Error {
  std::string message;  // one line: "<file>:<line>: <field>: expected ..., got ..."
};

template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}          // NOLINT(google-explicit-constructor)
  Result(Error error) : v_(std::move(error)) {}      // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }

  const T& value() const& { return std::get<T>(v_); }
  T& value() & { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  const T& operator*() const& { return value(); }
  const T* operator->() const { return &value(); }

  const std::string& error() const { return std::get<Error>(v_).message; }

 private:
  std::variant<T, Error> v_;
};

inline Error make_error(std::string message) { return Error{std::move(message)}; }

}  // namespace memwall
