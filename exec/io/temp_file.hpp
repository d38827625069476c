// TempFileGuard: a file this process made and must not leave behind (io-bench's test file, the
// engine's swap files). The guard removes it when it ends, and a handler on SIGINT, SIGTERM and
// SIGHUP removes every guarded file still registered, then lets the process die of the signal as
// it would have. The handler is installed while at least one guard lives and the previous handlers
// are put back after the last one ends.
// Thread-safety: guards may be made and ended from any thread. Up to kMaxGuardedFiles files are
// guarded against signals at once (paths below 4096 bytes); more are still removed when their guard
// ends.
#pragma once

#include <cstddef>
#include <string>

namespace memwall::io {

inline constexpr std::size_t kMaxGuardedFiles = 64;

class TempFileGuard {
 public:
  // Registers `path` (whether or not it exists yet: register before creating, so a signal during a
  // long preallocation still removes it).
  explicit TempFileGuard(std::string path);
  ~TempFileGuard();  // removes the file (quietly: gone or unremovable is not an error here)
  TempFileGuard(const TempFileGuard&) = delete;
  TempFileGuard& operator=(const TempFileGuard&) = delete;

  const std::string& path() const { return path_; }
  bool signal_safe() const { return slot_ >= 0; }  // false: the table was full or the path too long

 private:
  std::string path_;
  int slot_ = -1;
};

}  // namespace memwall::io
