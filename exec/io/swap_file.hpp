// SwapFile: the on-disk layout for offloaded states. One preallocated file per rank and state kind
// (`rank0003.optim32.swap`), holding every shard of that rank at a 4096-byte-aligned offset, instead
// of one file per tensor (DeepSpeed's swap folders pile up files and trip on "buffer nbytes != file
// bytes"). Each shard owns a slot of align_up(bytes) bytes; the padding lets shards of any size,
// including unaligned tails, use O_DIRECT. Owns the layout and the IoFile; the engine and the
// buffers belong to the caller. Thread-safety: read/write may be called from any thread (the
// engine is thread-safe); two in-flight writes of the same shard race, as with any file.
// Buffers: a shard's buffer must be 4096-aligned and hold slot_bytes (>= bytes); a read fills the
// whole slot, of which the first `bytes` are the tensor; a write stores whatever the buffer holds
// past `bytes` as padding.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "exec/io/io_engine.hpp"

namespace memwall::io {

struct SwapShard {
  std::uint64_t offset = 0;      // in the file, a multiple of 4096
  std::uint64_t bytes = 0;       // the tensor
  std::uint64_t slot_bytes = 0;  // align_up(bytes): what read/write transfer
};

// "rank0003.optim32.swap"; state is one of param16, grad16, optim32, act_ckpt.
Result<std::string> swap_file_name(int rank, std::string_view state);
// <dir>/swap_file_name(rank, state): where SwapFile::create puts it.
Result<std::string> swap_file_path(const std::string& dir, int rank, std::string_view state);

class SwapFile {
 public:
  // Lays out shards in order, creates (truncating) and preallocates <dir>/swap_file_name(...); when
  // it cannot (ENOSPC, EFBIG), the file is removed and the error names path and offset. The file
  // outlives the SwapFile: its owner (the engine) removes it.
  static Result<SwapFile> create(IoEngine& engine, const std::string& dir, int rank, std::string_view state,
                                 std::span<const std::uint64_t> shard_bytes);

  const IoFile& file() const { return file_; }
  std::size_t shards() const { return shards_.size(); }
  const SwapShard& shard(std::size_t i) const { return shards_.at(i); }
  std::uint64_t file_bytes() const;

  Result<IoHandle> write(std::size_t i, const void* src) const;
  Result<IoHandle> read(std::size_t i, void* dst) const;

 private:
  IoEngine* engine_ = nullptr;
  IoFile file_;
  std::vector<SwapShard> shards_;
};

}  // namespace memwall::io
