// IoEngine: asynchronous reads and writes of byte ranges of files, many in flight (the paper's
// DeepNVMe, Sec. 6.3). Owns its worker threads, its io_uring rings and the file descriptors of the
// IoFiles it opened; it does not own the memory it reads into or writes from (callers pass pinned
// buffers from PinnedPool or any suitably aligned memory). Two engines behind one interface:
// `uring` (liburing, the real one) and `psync` (pread/pwrite threads, for comparison and for
// systems without io_uring).
//
// Thread-safety: every member function may be called from any thread at the same time. Handles
// may be waited on from any thread. Completions are delivered by the engine's own threads.
//
// Alignment (O_DIRECT): when IoFile::direct() is true, every request's offset, length and buffer
// address must be multiples of kIoAlignment (4096 bytes); a misaligned request fails with a clear
// error instead of reaching the kernel. Buffered files (direct() false) accept any range. SwapFile
// pads shards so tensors of any size can still use direct I/O.
//
// Errors: a request that cannot complete (EIO, ENOSPC, EFBIG, reading past the end of a file) fails
// its handle with "<op> <path>: offset O length L: <strerror>"; short transfers are re-queued for the
// remaining bytes and -EAGAIN/-EINTR are retried, never reported. With EngineOptions::verify a read
// whose bytes differ from what the engine wrote there fails the same way. Nothing here exits or throws.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "model/result.hpp"

namespace memwall::io {

inline constexpr std::size_t kIoAlignment = 4096;  // O_DIRECT offset, length and address rule

constexpr std::uint64_t align_up(std::uint64_t n, std::uint64_t a = kIoAlignment) { return (n + a - 1) / a * a; }

using Status = Result<std::monostate>;  // ok, or one line a user can act on
inline Status ok_status() { return std::monostate{}; }

enum class EngineKind { uring, psync };
std::string to_string(EngineKind k);

enum class IoOp { read, write };

struct EngineOptions {
  unsigned queue_depth = 32;           // requests in flight per ring (uring) / worker threads (psync)
  std::size_t block_bytes = 1 << 20;   // requests longer than this are split into blocks (<= 1 GiB)
  unsigned rings = 1;                  // io_uring instances, one submitting thread each (uring only)
  bool direct = true;                  // open files with O_DIRECT where the filesystem supports it
  // Receives the one warning an engine may print (buffered fallback). Default: stderr.
  std::function<void(const std::string&)> warn;
  // Fault injection around the real engine (tests): sees the kernel's result for every transfer
  // (bytes moved, or -errno) with the path, offset and length asked for, and may replace it, e.g.
  // with -EIO or -ENOSPC at a chosen offset, or 0 (a read that found the end of the file). What
  // the engine does with the replaced result is what it does with a real one. Default: none.
  std::function<long(IoOp op, const std::string& path, std::uint64_t offset, std::size_t length, long result)>
      inject;
  // Verify what reads return (`--verify`): every completed write records a checksum of each 4 KiB
  // block it stored, every completed read recomputes them and fails with "<op> <path>: offset O
  // length 4096: verify: ..." when a block differs from what this engine wrote there, or was never
  // written by it. Requests must then be whole 4 KiB blocks (offset and length), as O_DIRECT needs
  // anyway. Costs one pass over the data per transfer on the engine's threads.
  bool verify = false;
};

// Bytes this engine moved (blocks that completed without error) and requests that failed.
struct IoCounters {
  std::uint64_t bytes_read = 0;
  std::uint64_t bytes_written = 0;
  std::uint64_t errors = 0;
  std::uint64_t bytes_verified = 0;  // read bytes checked against their write-time checksums (verify)
};

struct OpenOptions {
  bool create = true;                      // O_CREAT | O_NOFOLLOW: made if absent, a link at the path refused
  bool truncate = false;                   // a new empty file (a regular one there is replaced, a link refused)
  std::uint64_t preallocate_bytes = 0;     // fallocate() [0, n) when > 0, so writes never hit ENOSPC halfway
};

namespace detail {
struct FileState;
struct Batch;
}  // namespace detail

// An open file. Cheap to copy (shared); the descriptor closes when the last copy and the last
// request that uses it are gone, so dropping an IoFile with requests in flight is safe.
class IoFile {
 public:
  IoFile() = default;
  const std::string& path() const;
  bool direct() const;  // false after a buffered fallback
  std::uint64_t size_bytes() const;  // fstat, now
  int fd() const;

 private:
  friend class IoEngine;
  std::shared_ptr<const detail::FileState> state_;
};


struct IoRequest {
  IoOp op = IoOp::read;
  IoFile file;
  std::uint64_t offset = 0;
  void* buf = nullptr;  // the engine reads from / writes into it until the handle completes
  std::size_t length = 0;
};

// Completion of one submit() (one or many requests). Copyable; wait() from any thread.
class IoHandle {
 public:
  IoHandle() = default;
  Status wait() const;   // blocks (no spinning) until every request of the batch finished; first error
  bool done() const;     // non-blocking
  bool valid() const { return batch_ != nullptr; }

 private:
  friend class IoEngine;
  std::shared_ptr<detail::Batch> batch_;
};

class IoEngine {
 public:
  virtual ~IoEngine();
  IoEngine(const IoEngine&) = delete;
  IoEngine& operator=(const IoEngine&) = delete;

  virtual EngineKind kind() const = 0;
  const EngineOptions& options() const { return options_; }

  // Opens (and optionally preallocates) a file. With options().direct, a filesystem that refuses
  // O_DIRECT, or tmpfs/ramfs whose O_DIRECT is the page cache anyway, gets buffered I/O and the
  // engine's single warning (once per engine, not per file).
  Result<IoFile> open(const std::string& path, const OpenOptions& how = {});

  IoHandle submit(std::span<const IoRequest> requests);
  IoHandle read(const IoFile& f, std::uint64_t offset, void* buf, std::size_t length);
  IoHandle write(const IoFile& f, std::uint64_t offset, const void* buf, std::size_t length);

  // Waits for everything submitted so far; returns the first error of any request that finished
  // since the previous wait_all (so an error is not lost when its handle was dropped).
  Status wait_all();

  // Registers memory with the kernel once so requests inside it skip per-I/O page pinning
  // (io_uring fixed buffers). Call before submitting I/O that uses it; psync ignores it.
  virtual Status register_buffers(std::span<const iovec> regions);

  int warnings_issued() const;  // 0 or 1
  IoCounters counters() const;

 protected:
  explicit IoEngine(EngineOptions options);
  struct Chunk;                                   // one block of one request, queued to a worker
  virtual void enqueue(std::vector<Chunk*>& chunks) = 0;
  // Called by workers with the kernel's result for a chunk (bytes or -errno). `again`: issue the
  // chunk again for its remaining bytes (short transfer, -EAGAIN); `failed`: finished (and freed)
  // here with its error; `transferred`: every byte moved, and the worker calls complete(c) (the
  // uring worker refills its ring first, so --verify's checksums run while the disk works).
  enum class Outcome { again, transferred, failed };
  Outcome on_result(Chunk* c, long res);
  void complete(Chunk* c);                        // verify (if asked) and finish a transferred chunk
  void finish(Chunk* c, std::string error);       // fails a chunk outright (worker-side errors)

 private:
  void warn_once(const std::string& message);
  void account_done(IoOp op, std::size_t bytes, const std::string* error, std::size_t verified);
  std::string verify_chunk(const Chunk& c);       // verify: record (write) or check (read) block sums

  EngineOptions options_;
  struct Shared;
  std::unique_ptr<Shared> shared_;
};

struct IoEngine::Chunk {
  std::shared_ptr<detail::Batch> batch;
  std::shared_ptr<const detail::FileState> file;
  IoOp op;
  std::uint64_t offset;  // of the whole chunk
  char* buf;
  std::size_t length;
  std::size_t done = 0;  // bytes already transferred (short transfers advance it)
};

Result<std::unique_ptr<IoEngine>> make_engine(EngineKind kind, const EngineOptions& options = {});
Result<EngineKind> parse_engine_kind(const std::string& name);

}  // namespace memwall::io
