// What every fuzz target checks of a loader's answer (issue 16): an input is either accepted or
// refused with a non-empty, one-line message; nothing else (a crash, an exception, a sanitizer
// finding, a hang) is allowed. Header-only; each target includes it once.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "model/result.hpp"

namespace memwall::fuzz {

[[noreturn]] inline void fail(const char* what, const std::string& detail) {
  std::fprintf(stderr, "fuzz check failed: %s: %s\n", what, detail.c_str());
  std::abort();
}

template <typename T>
bool refused_in_one_line(const Result<T>& r) {
  if (r) return false;
  if (r.error().empty()) fail("empty error message", "");
  if (r.error().find('\n') != std::string::npos) fail("message is not one line", r.error());
  return true;
}

inline void finite_positive(double v, const char* field) {
  if (!std::isfinite(v) || !(v > 0)) fail("accepted a value that is not finite and > 0", field);
}

}  // namespace memwall::fuzz
