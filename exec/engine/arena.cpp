#include "exec/engine/arena.hpp"

#include <algorithm>
#include <iterator>

#include "model/units.hpp"

namespace memwall::exec {

Arena::Arena(char* base, std::size_t bytes, std::size_t align) : base_(base), bytes_(bytes / align * align), align_(align) {
  if (bytes_ > 0) free_[0] = bytes_;
}

std::optional<std::size_t> Arena::allocate(std::size_t bytes, std::size_t counted) {
  if (counted == ~std::size_t(0)) counted = bytes;
  const std::size_t need = (std::max<std::size_t>(bytes, 1) + align_ - 1) / align_ * align_;
  // Small ranges come from the top of the highest free range that holds them, large ones best fit
  // from the bottom: the schedule's many small buffers (LayerNorm parameters, their gradients) then
  // do not cut the holes its large ones (linear layers' parameters) need.
  const bool small = need * 64 <= bytes_;
  auto pick = free_.end();
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    if (small ? (pick == free_.end() || it->first > pick->first) : (pick == free_.end() || it->second < pick->second))
      pick = it;
  }
  if (pick == free_.end()) return std::nullopt;
  const std::size_t start = pick->first, len = pick->second;
  free_.erase(pick);
  std::size_t off = start;
  if (small) {
    off = start + len - need;
    if (len > need) free_[start] = len - need;
  } else if (len > need) {
    free_[start + need] = len - need;
  }
  used_[off] = {need, counted};
  live_ += counted;
  high_water_ = std::max(high_water_, live_);
  if (small) top_ = std::max(top_, bytes_ - off);
  else bottom_ = std::max(bottom_, off + need);
  return off;
}

void Arena::release(std::size_t offset) {
  auto u = used_.find(offset);
  if (u == used_.end()) return;
  std::size_t off = offset, len = u->second.first;
  live_ -= u->second.second;
  used_.erase(u);
  auto next = free_.lower_bound(off);
  if (next != free_.end() && off + len == next->first) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == off) {
      prev->second += len;
      return;
    }
  }
  free_[off] = len;
}

std::size_t Arena::largest_free() const {
  std::size_t m = 0;
  for (const auto& [off, len] : free_) m = std::max(m, len);
  return m;
}

std::string Arena::describe() const {
  return format_bytes(double(live_)) + " live of " + format_bytes(double(bytes_)) + ", largest free range " +
         format_bytes(double(largest_free())) + " in " + std::to_string(free_.size()) + " ranges";
}

}  // namespace memwall::exec
