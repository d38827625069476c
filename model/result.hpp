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

// Every message is one line: trailing blanks and line breaks go, and a control character that
// input put inside (yaml-cpp quotes the offending character: "unknown escape character: \n") is
// written as an escape (\n, \r, \x1b), so a fuzzed file can never split or colour an error.
inline std::string one_line(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\r')) s.pop_back();
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20 && c != '\t') {
      const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else if (c == 0x7f) out += "\\x7f";
    else out += ch;
  }
  return out;
}

inline Error make_error(std::string message) { return Error{one_line(std::move(message))}; }

}  // namespace memwall
