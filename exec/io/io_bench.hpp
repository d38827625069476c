// run_io_bench: the measurement behind `memwall io-bench`. Writes and reads one preallocated file
// in <dir> sequentially and in random block order, queue_depth requests in flight in the kernel and
// as many again queued behind them in the engine (kWindowPerQueueSlot), each on its own PinnedPool
// slab, and reports bandwidth per phase as defined in
// results/METRICS.md ("## I/O"). Owns its temporary file (removed before returning, and by a
// handler on SIGINT, SIGTERM and SIGHUP while it exists) and its pool and engine. Not reentrant;
// call from one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "exec/io/io_engine.hpp"

namespace memwall::io {

inline constexpr std::size_t kWindowPerQueueSlot = 2;  // requests outstanding per queue_depth slot

struct IoBenchOptions {
  std::string dir;                               // an existing directory on the filesystem to measure
  std::uint64_t size_bytes = std::uint64_t{4} << 30;  // file size; a multiple of block_bytes
  std::size_t block_bytes = 1 << 20;             // one request; a multiple of 4096
  unsigned queue_depth = 32;                     // requests in flight
  EngineKind engine = EngineKind::uring;
  unsigned rings = 1;
  bool verify = false;                           // check every block read against its write-time checksum
  std::function<void(const std::string&)> progress;  // about once a second during long phases
  std::function<void(const std::string&)> warn;      // the engine's buffered-fallback warning
};

struct IoBenchPhase {
  std::string name;  // seq_write, seq_read, rand_write, rand_read
  std::uint64_t bytes = 0;
  double seconds = 0;
  double Bps = 0;  // bytes / seconds
};

struct IoBenchResult {
  std::string file;               // the temporary file used (already removed)
  bool direct = false;            // O_DIRECT was used; false: buffered, numbers include the page cache
  bool pinned = false;            // buffers mlock'd
  bool registered_buffers = false;  // buffers registered with io_uring
  bool huge_pages = false;        // the kernel gives the buffers transparent huge pages (map_host_memory)
  std::string notes;              // why pinned or registered_buffers is false, if so
  std::vector<IoBenchPhase> phases;
  std::uint64_t verified_bytes = 0;  // read bytes checked (verify); a mismatch fails the run instead
  double write_Bps = 0, read_Bps = 0, rand_write_Bps = 0, rand_read_Bps = 0;
};

Result<IoBenchResult> run_io_bench(const IoBenchOptions& options);

}  // namespace memwall::io
