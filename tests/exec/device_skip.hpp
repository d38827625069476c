// When a test of a compiled backend may skip: only when the backend says its device is absent
// ("no CUDA device ...", exec/backend/backend_cuda.cu: no NVIDIA driver, or one that sees no GPU)
// and MEMWALL_REQUIRE_CUDA is not 1. bench/gpu/run.sh sets it: on a GPU machine a skip is a
// failure, and a device that is there but broken (a driver too old, a device error) never skips.
#pragma once

#include <cstdlib>
#include <string>

namespace memwall::test {

inline bool cuda_required() {
  const char* v = std::getenv("MEMWALL_REQUIRE_CUDA");
  return v && std::string(v) == "1";
}

inline bool may_skip_for_device(const std::string& error) {
  return error.find("no CUDA device") != std::string::npos && !cuda_required();
}

}  // namespace memwall::test
