#include "exec/io/swap_file.hpp"

#include <cstdio>
#include <filesystem>

namespace memwall::io {

Result<std::string> swap_file_name(int rank, std::string_view state) {
  if (rank < 0) return make_error("swap file: rank must be >= 0, got " + std::to_string(rank));
  if (state != "param16" && state != "grad16" && state != "optim32" && state != "act_ckpt")
    return make_error("swap file: state must be param16, grad16, optim32 or act_ckpt, got \"" + std::string(state) +
                      "\"");
  char buf[32];
  std::snprintf(buf, sizeof buf, "rank%04d.", rank);
  return std::string(buf) + std::string(state) + ".swap";
}

Result<std::string> swap_file_path(const std::string& dir, int rank, std::string_view state) {
  Result<std::string> name = swap_file_name(rank, state);
  if (!name) return name;
  return dir + "/" + *name;
}

Result<SwapFile> SwapFile::create(IoEngine& engine, const std::string& dir, int rank, std::string_view state,
                                  std::span<const std::uint64_t> shard_bytes) {
  Result<std::string> where = swap_file_path(dir, rank, state);
  if (!where) return make_error(where.error());
  const std::string& path = *where;
  SwapFile s;
  s.engine_ = &engine;
  std::uint64_t at = 0;
  for (std::uint64_t b : shard_bytes) {
    s.shards_.push_back({at, b, align_up(b)});
    at += align_up(b);
  }
  Result<IoFile> f = engine.open(path, {.create = true, .truncate = true, .preallocate_bytes = at});
  if (!f) {
    std::error_code ec;  // opened (and truncated) but not preallocated, e.g. ENOSPC: nothing worth keeping
    if (std::filesystem::is_regular_file(path, ec)) std::filesystem::remove(path, ec);
    return make_error(f.error());
  }
  s.file_ = *f;
  return s;
}

std::uint64_t SwapFile::file_bytes() const {
  return shards_.empty() ? 0 : shards_.back().offset + shards_.back().slot_bytes;
}

Result<IoHandle> SwapFile::write(std::size_t i, const void* src) const {
  if (i >= shards_.size())
    return make_error(file_.path() + ": shard " + std::to_string(i) + " out of range (" +
                      std::to_string(shards_.size()) + " shards)");
  return engine_->write(file_, shards_[i].offset, src, shards_[i].slot_bytes);
}

Result<IoHandle> SwapFile::read(std::size_t i, void* dst) const {
  if (i >= shards_.size())
    return make_error(file_.path() + ": shard " + std::to_string(i) + " out of range (" +
                      std::to_string(shards_.size()) + " shards)");
  return engine_->read(file_, shards_[i].offset, dst, shards_[i].slot_bytes);
}

}  // namespace memwall::io
