// Helpers for the exec/io tests: a scratch directory on a real disk (O_DIRECT works there) or on
// tmpfs, aligned buffers and random bytes. Big files stay out of the repository tree.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

namespace memwall::io::testing {

// /var/tmp is on the machine's disk here (/dev/shm is tmpfs, used only for the fallback test).
class ScratchDir {
 public:
  explicit ScratchDir(const std::string& parent = "/var/tmp") {
    std::string tmpl = parent + "/memwall-io-test-XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    if (!p) throw std::runtime_error("mkdtemp " + tmpl + ": " + std::strerror(errno));
    path_ = p;
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using AlignedBytes = std::unique_ptr<unsigned char[], FreeDeleter>;

inline AlignedBytes aligned_bytes(std::size_t n, unsigned char fill = 0) {
  std::size_t rounded = (n + 4095) / 4096 * 4096;
  auto* p = static_cast<unsigned char*>(std::aligned_alloc(4096, rounded == 0 ? 4096 : rounded));
  std::memset(p, fill, rounded == 0 ? 4096 : rounded);
  return AlignedBytes(p);
}

inline void fill_random(void* p, std::size_t n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto* b = static_cast<unsigned char*>(p);
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t v = rng();
    std::memcpy(b + i, &v, 8);
  }
  for (; i < n; ++i) b[i] = static_cast<unsigned char>(rng());
}

}  // namespace memwall::io::testing
