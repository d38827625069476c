// PinnedPool: the pinned memory management layer of Sec. 6.3. Owns one page-aligned, mlock'd
// region of at most `budget_bytes`, cut into fixed-size slabs that are handed out and reused (never
// reallocated, so the pool cannot fragment). It does not own what callers put in the slabs, nor
// the engines that read into them (register_buffers hands the region to io_uring).
// Thread-safety: acquire/try_acquire/stats may be called from any thread; a PinnedBuffer may be
// released (destroyed) on any thread. The pool must outlive every PinnedBuffer it handed out.
// Alignment: every slab starts on a 4096-byte boundary and is a multiple of 4096 bytes long, so
// slabs satisfy IoEngine's O_DIRECT rules. Locking: the whole budget is locked at create(); if
// mlock fails (RLIMIT_MEMLOCK without CAP_IPC_LOCK) create() fails with the limit in the message,
// unless require_lock is false, in which case the pool works unlocked and stats().locked says so.
// (cudaHostRegister is not done here yet: exec/io builds without CUDA.)
#pragma once

#include <sys/uio.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "model/result.hpp"

namespace memwall::io {

// Anonymous host memory for buffers that DMA reads and writes land in: aligned to 2 MiB and advised
// for transparent huge pages (MADV_HUGEPAGE), so a 1 MiB O_DIRECT request is one physically
// contiguous segment instead of 256 pages; on a virtio disk that took io-bench's reads from 1.5 to
// 2.8 GB/s and writes from 2.2 to 3.7 (bench/io). Huge pages are advice: where the kernel has them
// off (/sys/kernel/mm/transparent_hugepage/enabled = never) the memory is ordinary pages. `populate`
// faults every page in before returning. nullptr with errno set on failure; free with
// unmap_host_memory(p, bytes) using the same `bytes`.
void* map_host_memory(std::size_t bytes, bool populate);
void unmap_host_memory(void* p, std::size_t bytes);
// Whether the kernel gives transparent huge pages to memory that asks (always or madvise).
bool huge_pages_available();

struct PinnedPoolOptions {
  std::size_t budget_bytes = 0;        // hard cap on pinned bytes; rounded down to whole slabs
  std::size_t slab_bytes = 1 << 20;    // every buffer is one slab; a positive multiple of 4096
  bool require_lock = true;            // mlock failure is an error (true) or reported in stats (false)
  // regions() cuts the pool into pieces of at most this many bytes: io_uring refuses to register a
  // buffer over 1 GiB (and a test lowers it to see a small pool cut)
  std::size_t register_piece_bytes = std::size_t(1) << 30;
};

struct PinnedPoolStats {
  std::size_t budget_bytes = 0;        // as asked
  std::size_t slab_bytes = 0;
  std::size_t slabs = 0;               // budget_bytes / slab_bytes
  std::size_t in_use_bytes = 0;        // slabs handed out now, times slab_bytes
  std::size_t high_water_bytes = 0;    // the most in_use_bytes ever reached
  std::uint64_t acquires = 0;          // successful acquisitions
  std::uint64_t reuses = 0;            // of those, slabs that had been handed out before
  bool locked = false;                 // mlock succeeded
};

class PinnedPool;

// One slab, returned to its pool when destroyed. Move-only.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& o) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  ~PinnedBuffer();

  void* data() const { return data_; }
  std::size_t size() const { return size_; }  // the slab size, >= what was asked
  explicit operator bool() const { return data_ != nullptr; }
  void release();  // gives the slab back now

 private:
  friend class PinnedPool;
  PinnedPool* pool_ = nullptr;
  std::size_t slab_ = 0;
  void* data_ = nullptr;
  std::size_t size_ = 0;
};

class PinnedPool {
 public:
  static Result<std::unique_ptr<PinnedPool>> create(const PinnedPoolOptions& options);
  ~PinnedPool();
  PinnedPool(const PinnedPool&) = delete;
  PinnedPool& operator=(const PinnedPool&) = delete;

  // A slab for `bytes` (<= slab_bytes). Blocks until one is free; fails at once, with the sizes in
  // the message, when the request can never fit.
  Result<PinnedBuffer> acquire(std::size_t bytes);
  // Same, but fails at once when every slab is in use (the budget is reached).
  Result<PinnedBuffer> try_acquire(std::size_t bytes);

  PinnedPoolStats stats() const;
  // The pool's memory, in pieces io_uring accepts (<= register_piece_bytes, 1 GiB, each), for
  // IoEngine::register_buffers: on slab boundaries where a slab fits in a piece, else inside slabs
  // (an I/O that spans two pieces is then issued unregistered).
  std::vector<iovec> regions() const;

 private:
  explicit PinnedPool(const PinnedPoolOptions& o) : options_(o) {}
  Result<PinnedBuffer> take(std::size_t bytes, bool block);
  void give_back(std::size_t slab);
  friend class PinnedBuffer;

  PinnedPoolOptions options_;
  char* base_ = nullptr;
  std::size_t mapped_bytes_ = 0;
  bool locked_ = false;
  mutable std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::size_t> free_;   // slab indices, LIFO so a just-released slab is reused first
  std::vector<bool> used_before_;   // per slab
  PinnedPoolStats stats_;
};

}  // namespace memwall::io
