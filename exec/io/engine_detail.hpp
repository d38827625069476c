// Internals shared by the IoEngine implementations (io_engine.cpp, uring_engine.cpp,
// psync_engine.cpp). Not part of the public API; nothing outside exec/io includes it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "exec/io/io_engine.hpp"

// liburing calls return -errno; this turns a failure into an Error naming the call and file:line.
#define MEMWALL_URING_CHECK(expr)                                                                  \
  do {                                                                                             \
    int memwall_uring_rc_ = (expr);                                                                \
    if (memwall_uring_rc_ < 0)                                                                     \
      return ::memwall::make_error(::memwall::io::detail::call_error(#expr, -memwall_uring_rc_, __FILE__, __LINE__)); \
  } while (0)

namespace memwall::io::detail {

struct FileState {
  int fd = -1;
  std::string path;
  bool direct = false;
  // EngineOptions::verify: a checksum per 4 KiB block of the file, recorded when a write of it
  // completes (0: never written by this engine), compared when a read of it completes.
  mutable std::mutex verify_m;
  mutable std::vector<std::uint64_t> block_sums;
  ~FileState();
};

struct Batch {
  std::mutex m;
  std::condition_variable cv;
  std::size_t pending = 0;  // chunks not yet finished
  std::string error;        // first error, empty when none
};

// "<file>:<line>: <call>: <strerror> (errno N)"
std::string call_error(const char* call, int err, const char* file, int line);

// "<op> <path>: offset O length L: <what>"
std::string io_error(IoOp op, const std::string& path, std::uint64_t offset, std::uint64_t length,
                     const std::string& what);

std::unique_ptr<IoEngine> make_uring_engine(const EngineOptions& options, std::string* error);
std::unique_ptr<IoEngine> make_psync_engine(const EngineOptions& options);

}  // namespace memwall::io::detail
