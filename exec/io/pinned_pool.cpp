#include "exec/io/pinned_pool.hpp"

#include <sys/mman.h>
#include <sys/resource.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#include "exec/io/io_engine.hpp"
#include "model/units.hpp"

namespace memwall::io {

namespace {
constexpr std::size_t kHugePage = std::size_t{2} << 20;
}  // namespace

void* map_host_memory(std::size_t bytes, bool populate) {
  // Over-map by one huge page and trim both ends so the region starts on a 2 MiB boundary (the
  // kernel aligns large anonymous maps itself since 6.7; older ones do not).
  const std::size_t want = (bytes + kIoAlignment - 1) / kIoAlignment * kIoAlignment;
  if (want == 0) {
    errno = EINVAL;
    return nullptr;
  }
  void* m = ::mmap(nullptr, want + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  char* raw = static_cast<char*>(m);
  char* p = reinterpret_cast<char*>((reinterpret_cast<std::uintptr_t>(raw) + kHugePage - 1) / kHugePage * kHugePage);
  if (p > raw) ::munmap(raw, std::size_t(p - raw));
  if (std::size_t tail = std::size_t(raw + want + kHugePage - (p + want)); tail > 0) ::munmap(p + want, tail);
  ::madvise(p, want, MADV_HUGEPAGE);  // advice: fails harmlessly where THP is compiled out
  if (populate) {
#ifdef MADV_POPULATE_WRITE
    if (::madvise(p, want, MADV_POPULATE_WRITE) == 0) return p;
#endif
    for (std::size_t at = 0; at < want; at += kIoAlignment) p[at] = 0;  // kernels before 5.14
  }
  return p;
}

void unmap_host_memory(void* p, std::size_t bytes) {
  if (p) ::munmap(p, (bytes + kIoAlignment - 1) / kIoAlignment * kIoAlignment);
}

bool huge_pages_available() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  return std::getline(f, line) && line.find("[never]") == std::string::npos;
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& o) noexcept { *this = std::move(o); }

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    release();
    pool_ = o.pool_;
    slab_ = o.slab_;
    data_ = o.data_;
    size_ = o.size_;
    o.pool_ = nullptr;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() { release(); }

void PinnedBuffer::release() {
  if (pool_) pool_->give_back(slab_);
  pool_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

Result<std::unique_ptr<PinnedPool>> PinnedPool::create(const PinnedPoolOptions& o) {
  if (o.slab_bytes == 0 || o.slab_bytes % kIoAlignment)
    return make_error("pinned pool: slab size must be a positive multiple of 4096 bytes, got " +
                      std::to_string(o.slab_bytes));
  if (o.budget_bytes < o.slab_bytes)
    return make_error("pinned pool: budget " + format_bytes(static_cast<double>(o.budget_bytes)) +
                      " is smaller than one slab (" + format_bytes(static_cast<double>(o.slab_bytes)) + ")");
  std::unique_ptr<PinnedPool> p(new PinnedPool(o));
  std::size_t slabs = o.budget_bytes / o.slab_bytes;
  p->mapped_bytes_ = slabs * o.slab_bytes;
  void* mem = map_host_memory(p->mapped_bytes_, true);
  if (!mem)
    return make_error("pinned pool: mmap of " + format_bytes(static_cast<double>(p->mapped_bytes_)) +
                      " failed: " + std::strerror(errno));
  p->base_ = static_cast<char*>(mem);
  if (::mlock(p->base_, p->mapped_bytes_) == 0) {
    p->locked_ = true;
  } else {
    int err = errno;
    if (o.require_lock) {
      rlimit rl{};
      ::getrlimit(RLIMIT_MEMLOCK, &rl);
      std::string limit =
          rl.rlim_cur == RLIM_INFINITY ? "unlimited" : format_bytes(static_cast<double>(rl.rlim_cur));
      return make_error("pinned pool: mlock of " + format_bytes(static_cast<double>(p->mapped_bytes_)) +
                        " failed: " + std::strerror(err) + " (RLIMIT_MEMLOCK is " + limit +
                        "; raise it with ulimit -l, or grant CAP_IPC_LOCK, or lower the pinned budget)");
    }
  }
  p->free_.reserve(slabs);
  for (std::size_t i = slabs; i-- > 0;) p->free_.push_back(i);  // slab 0 is handed out first
  p->used_before_.assign(slabs, false);
  p->stats_.budget_bytes = o.budget_bytes;
  p->stats_.slab_bytes = o.slab_bytes;
  p->stats_.slabs = slabs;
  p->stats_.locked = p->locked_;
  return p;
}

PinnedPool::~PinnedPool() {
  if (base_) {
    if (locked_) ::munlock(base_, mapped_bytes_);
    unmap_host_memory(base_, mapped_bytes_);
  }
}

Result<PinnedBuffer> PinnedPool::acquire(std::size_t bytes) { return take(bytes, true); }
Result<PinnedBuffer> PinnedPool::try_acquire(std::size_t bytes) { return take(bytes, false); }

Result<PinnedBuffer> PinnedPool::take(std::size_t bytes, bool block) {
  if (bytes > options_.slab_bytes)
    return make_error("pinned pool: a buffer of " + format_bytes(static_cast<double>(bytes)) +
                      " can never fit: slabs are " + format_bytes(static_cast<double>(options_.slab_bytes)) +
                      " (budget " + format_bytes(static_cast<double>(options_.budget_bytes)) +
                      "); split the transfer or raise the slab size");
  std::unique_lock lock(m_);
  if (block) cv_.wait(lock, [&] { return !free_.empty(); });
  if (free_.empty())
    return make_error("pinned pool: budget reached: all " + std::to_string(stats_.slabs) + " slabs (" +
                      format_bytes(static_cast<double>(mapped_bytes_)) + ") are in use");
  std::size_t slab = free_.back();
  free_.pop_back();
  ++stats_.acquires;
  if (used_before_[slab]) ++stats_.reuses;
  used_before_[slab] = true;
  stats_.in_use_bytes += options_.slab_bytes;
  stats_.high_water_bytes = std::max(stats_.high_water_bytes, stats_.in_use_bytes);
  PinnedBuffer b;
  b.pool_ = this;
  b.slab_ = slab;
  b.data_ = base_ + slab * options_.slab_bytes;
  b.size_ = options_.slab_bytes;
  return b;
}

void PinnedPool::give_back(std::size_t slab) {
  {
    std::lock_guard lock(m_);
    free_.push_back(slab);
    stats_.in_use_bytes -= options_.slab_bytes;
  }
  cv_.notify_one();
}

PinnedPoolStats PinnedPool::stats() const {
  std::lock_guard lock(m_);
  return stats_;
}

std::vector<iovec> PinnedPool::regions() const {
  // io_uring limits one registered buffer to 1 GiB; cut on slab boundaries where slabs fit in a
  // piece (the engine's arena is one slab of any size: cut inside it)
  const std::size_t limit = std::max<std::size_t>(4096, options_.register_piece_bytes);
  const std::size_t max_piece = options_.slab_bytes <= limit ? limit / options_.slab_bytes * options_.slab_bytes : limit;
  std::vector<iovec> out;
  for (std::size_t at = 0; at < mapped_bytes_; at += max_piece)
    out.push_back({base_ + at, std::min(max_piece, mapped_bytes_ - at)});
  return out;
}

}  // namespace memwall::io
