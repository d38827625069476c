// Arena: hands out byte ranges of one region reserved up front (device memory of a backend, or
// pinned host memory) and takes them back, so the engine never allocates in its hot loop (a
// cudaMalloc while NCCL runs can hang it) and can report what it really held. A free list ordered
// by offset, neighbours coalesced on release; large ranges best fit from the bottom, small ones
// (under 1/64 of the region) from the top; every range starts on `align`.
// Owns the bookkeeping, not the region. Thread-safety: none; the engine's dispatcher owns it.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>

namespace memwall::exec {

class Arena {
 public:
  Arena() = default;
  Arena(char* base, std::size_t bytes, std::size_t align);

  // A range of at least `bytes` (rounded up to the alignment), or nothing when no free range is
  // large enough. `bytes` 0 gets a range of one alignment unit. `counted` is what live_bytes()
  // counts for it (default: bytes), for a range laid out larger than what it stands for.
  std::optional<std::size_t> allocate(std::size_t bytes, std::size_t counted = ~std::size_t(0));
  void release(std::size_t offset);  // a range allocate() returned
  char* at(std::size_t offset) const { return base_ + offset; }

  std::size_t capacity() const { return bytes_; }
  std::size_t live_bytes() const { return live_; }             // as asked, not rounded
  std::size_t high_water_bytes() const { return high_water_; }  // most live_bytes ever
  // bytes of the region ever touched: the bottom up to the highest large range, plus the top down
  // to the lowest small one (fragmentation included; at most capacity())
  std::size_t extent_high_water() const { return std::min(bytes_, bottom_ + top_); }
  std::size_t largest_free() const;
  std::size_t free_ranges() const { return free_.size(); }
  std::string describe() const;  // "X live of Y, largest free range Z in N ranges"

 private:
  char* base_ = nullptr;
  std::size_t bytes_ = 0, align_ = 1;
  std::map<std::size_t, std::size_t> free_;                         // offset -> length
  std::map<std::size_t, std::pair<std::size_t, std::size_t>> used_;  // offset -> (length, asked)
  std::size_t live_ = 0, high_water_ = 0, bottom_ = 0, top_ = 0;
};

}  // namespace memwall::exec
