#include "exec/engine/tiers.hpp"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include "exec/engine/engine.hpp"
#include "model/units.hpp"

namespace memwall::exec {
namespace {

constexpr std::size_t kDeviceAlign = 256;
constexpr std::size_t kPage = io::kIoAlignment;
std::size_t align_to(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

// A 4096-aligned host buffer for O_DIRECT transfers outside the pinned arena (setup, checkpoints).
struct AlignedBuffer {
  char* p = nullptr;
  explicit AlignedBuffer(std::size_t n) : p(static_cast<char*>(std::aligned_alloc(kPage, align_to(std::max<std::size_t>(n, 1), kPage)))) {
    if (p) std::memset(p, 0, align_to(std::max<std::size_t>(n, 1), kPage));
  }
  ~AlignedBuffer() { std::free(p); }
};

Result<bool> wait(Result<io::IoHandle> h) {
  if (!h) return make_error(h.error());
  io::Status st = h->wait();
  if (!st) return make_error(st.error());
  return true;
}

// A count the schedule keeps as a double, as whole elements.
bool whole(double x, std::size_t& out) {
  if (!(x >= 0) || x != std::floor(x) || x > 1e18) return false;
  out = std::size_t(x);
  return true;
}

}  // namespace

HostRegion::~HostRegion() {
  io::unmap_host_memory(p, bytes);
}

bool HostRegion::make(std::size_t n) {
  bytes = align_to(std::max<std::size_t>(n, 1), kPage);
  p = static_cast<char*>(io::map_host_memory(bytes, false));
  return p != nullptr;
}

Tiers::~Tiers() {
  if (ioe_) (void)ioe_->wait_all();
  swap_guards_.clear();
  if (be_) {
    if (device_block_) be_->ops().free(be_->ctx(), device_block_);
    if (be_->ops().host_unregister)
      for (void* p : registered_) be_->ops().host_unregister(be_->ctx(), p);
  }
}

Tier Tiers::tier(State s) const { return o_->placement.of(s).tier; }
bool Tiers::sharded(State s) const { return o_->placement.of(s).partitioned && dp_ > 1; }

Result<bool> Tiers::lay_out(const EngineOptions& o, const GptConfig& model, int rank, int dp, int file_rank,
                            const Schedule& s) {
  o_ = &o;
  model_ = model;
  rank_ = rank;
  dp_ = dp;
  file_rank_ = file_rank;
  psz_ = adam::dtype_bytes(o.precision);
  groups_ = gpt_param_groups(model);
  for (const ScheduleUnit& su : s.units) {
    UnitLayout u;
    const int g = param_group_of(model, su.role, su.block);
    if (g < 0) return make_error("internal error: the schedule's unit " + su.name + " is no parameter group of the GPT");
    u.group = std::size_t(g);
    u.tile = su.tile;
    u.root = su.root;
    if (!whole(su.elems, u.elems) || !whole(su.from, u.from) || !whole(su.len, u.len) || !whole(su.whole_at, u.whole_at) ||
        !whole(su.part_at, u.part_at) || (!s.broadcast && !whole(su.shard, u.shard)))
      return make_error("--dp " + std::to_string(dp) + ": the " + format_g(su.elems) + " parameters of " + su.name +
                        " do not split evenly over " + std::to_string(dp) +
                        " ranks (choose a data-parallel degree that divides the hidden size)");
    if (s.broadcast) u.shard = u.elems / std::size_t(dp);
    n_whole_ += u.elems;
    n_part_ += u.len;
    units_.push_back(u);
  }
  for (const ScheduleChunk& sc : s.optimizer_chunks) {
    ChunkLayout c;
    bool ok = whole(sc.start, c.start) && whole(sc.params, c.count);
    for (const ChunkPiece& pc : sc.pieces) {
      PieceLayout p;
      p.unit = std::size_t(pc.unit);
      ok = ok && whole(pc.from, p.from) && whole(pc.count, p.count);
      c.pieces.push_back(p);
    }
    for (const auto* at : {&sc.grad_at, &sc.param_at})
      for (double b : *at) {
        std::size_t v = 0;
        ok = ok && whole(b, v);
        (at == &sc.grad_at ? c.grad_at : c.param_at).push_back(v);
      }
    if (!ok) return make_error("internal error: optimizer chunk at " + format_g(sc.start) + " is not whole parameters");
    chunks_.push_back(std::move(c));
  }
  return true;
}

char* Tiers::state_ptr(State s) {
  const Tier t = tier(s);
  if (t == Tier::gpu) return dev_state_[size_t(s)];
  if (t == Tier::cpu) return (s == State::param16 ? host_param_ : s == State::grad16 ? host_grad_ : host_optim_).p;
  return nullptr;
}

char* Tiers::slice_in(State s, const UnitLayout& u, std::size_t j) {
  const std::size_t at = sharded(s) ? u.part_at + j : u.whole_at + (sharded(State::optim32) ? u.from : 0) + j;
  return state_ptr(s) + at * psz_;
}

char* Tiers::buffer(const Schedule& s, int id) const {
  const Buffer& b = s.buffers[size_t(id)];
  return arena_base_[size_t(b.tier)] + b.offset;
}

std::size_t Tiers::host_state_bytes() const {
  std::size_t n = 0;
  for (const HostRegion* r : {&host_param_, &host_grad_, &host_optim_})
    if (r->p) n += r->bytes;
  return n;
}

std::size_t Tiers::swap_bytes() const {
  std::size_t s = 0;
  for (const auto* f : {&swap_param_, &swap_grad_, &swap_optim_})
    if (*f) s += (*f)->file_bytes();
  return s;
}

Result<bool> Tiers::check_nvme_dir(std::size_t need) {
  if (o_->nvme_dir.empty()) {
    std::string which;
    for (State s : {State::param16, State::grad16, State::optim32})
      if (tier(s) == Tier::nvme) which += (which.empty() ? "" : ", ") + std::string(to_string(s));
    return make_error("--nvme-dir: needed because " + which + " live on nvme (a folder on the drive to swap to)");
  }
  std::error_code ec;
  if (!std::filesystem::is_directory(o_->nvme_dir, ec)) return make_error("--nvme-dir " + o_->nvme_dir + ": not a folder");
  struct statvfs vs {};
  if (::statvfs(o_->nvme_dir.c_str(), &vs) != 0)
    return make_error("--nvme-dir " + o_->nvme_dir + ": statvfs: " + std::strerror(errno));
  const double free_bytes = double(vs.f_bavail) * double(vs.f_frsize);
  if (double(need) > free_bytes && vs.f_blocks > 0)  // (no blocks at all: /proc and the like, refused below)
    return make_error("--nvme-dir " + o_->nvme_dir + ": the swap files need " + format_bytes(double(need)) + " (" +
                      std::to_string(need) + " bytes), " + format_bytes(free_bytes) + " are free");
  // The folder is this run's while it lives (a second run on it is refused with our pid), which
  // also proves it writable; swap files left by a killed run are then ours to replace.
  Result<io::FolderLock> lock = io::FolderLock::acquire(o_->nvme_dir, file_rank_, "--nvme-dir");
  if (!lock) return make_error(lock.error());
  nvme_lock_ = std::move(lock).value();
  return true;
}

// One preallocated swap file per state on NVMe: a slot per unit (param16, grad16: this rank's
// part) or per chunk (optim32), each 4 KiB aligned.
Result<bool> Tiers::make_swap_files() {
  std::vector<std::uint64_t> unit_bytes, chunk_bytes;  // NVMe states are partitioned (validate says so)
  for (const UnitLayout& u : units_) unit_bytes.push_back(u.len * psz_);
  for (const ChunkLayout& c : chunks_) chunk_bytes.push_back(12 * c.count);
  auto slots = [](const std::vector<std::uint64_t>& v) {
    std::size_t s = 0;
    for (std::uint64_t b : v) s += io::align_up(b);
    return s;
  };
  std::size_t need = 0;
  if (tier(State::param16) == Tier::nvme) need += slots(unit_bytes);
  if (tier(State::grad16) == Tier::nvme) need += slots(unit_bytes);
  if (tier(State::optim32) == Tier::nvme) need += slots(chunk_bytes);
  if (need == 0) return true;
  if (Result<bool> ok = check_nvme_dir(need); !ok) return ok;
  Result<std::unique_ptr<io::IoEngine>> e = io::make_engine(io::EngineKind::uring, o_->io);
  if (!e) return make_error("io engine: " + e.error());
  ioe_ = std::move(e).value();
  auto make = [&](const char* state, const std::vector<std::uint64_t>& shards, std::optional<io::SwapFile>& out) -> Result<bool> {
    Result<std::string> path = io::swap_file_path(o_->nvme_dir, file_rank_, state);
    if (!path) return make_error(path.error());
    // guarded before it exists: a signal during the preallocation removes it too
    swap_guards_.push_back(std::make_unique<io::TempFileGuard>(*path));
    Result<io::SwapFile> f = io::SwapFile::create(*ioe_, o_->nvme_dir, file_rank_, state, shards);
    if (!f) return make_error("--nvme-dir: " + f.error());  // create removed a file it could not fill
    out = std::move(f).value();
    return true;
  };
  if (tier(State::param16) == Tier::nvme)
    if (Result<bool> r = make("param16", unit_bytes, swap_param_); !r) return r;
  if (tier(State::grad16) == Tier::nvme)
    if (Result<bool> r = make("grad16", unit_bytes, swap_grad_); !r) return r;
  if (tier(State::optim32) == Tier::nvme)
    if (Result<bool> r = make("optim32", chunk_bytes, swap_optim_); !r) return r;
  return true;
}

// One device block: the states on the device, then the buffer arena the plans need.
Result<bool> Tiers::make_device(const std::vector<const Schedule*>& plans) {
  for (const Schedule* p : plans) arena_[size_t(Tier::gpu)] = std::max(arena_[size_t(Tier::gpu)], std::size_t(p->arena_bytes[size_t(Tier::gpu)]));
  std::array<std::size_t, 3> at{};
  std::size_t total = 0;
  for (State s : {State::param16, State::grad16, State::optim32}) {
    at[size_t(s)] = total;
    if (tier(s) == Tier::gpu) total += align_to(state_bytes(s), kDeviceAlign);
  }
  dev_states_ = total;
  const std::size_t need = total + arena_[size_t(Tier::gpu)];
  const BackendCaps& caps = be_->caps();
  if (caps.capacity_bytes - caps.reserved_bytes < need)
    return make_error("device: " + caps.device + " has " + format_bytes(double(caps.capacity_bytes)) +
                      (caps.reserved_bytes ? " (" + format_bytes(double(caps.reserved_bytes)) + " of it the " + caps.name +
                                                 " backend's own workspaces)"
                                           : std::string()) +
                      ", the memory plan needs " + format_bytes(double(need)) + " (states " + format_bytes(double(total)) +
                      ", buffers " + format_bytes(double(arena_[size_t(Tier::gpu)])) + "; the profile says " +
                      format_bytes(o_->profile.gpu_memory_bytes) + ")");
  Result<void*> block = be_->ops().alloc(be_->ctx(), need);
  if (!block) return make_error("device: " + block.error());
  device_block_ = *block;
  char* base = static_cast<char*>(*block);  // 256-byte aligned (the backend's contract)
  for (State s : {State::param16, State::grad16, State::optim32})
    if (tier(s) == Tier::gpu) dev_state_[size_t(s)] = base + at[size_t(s)];
  arena_base_[size_t(Tier::gpu)] = base + total;
  return true;
}

// Host memory: the states in CPU memory, and the pinned arena for the plan's CPU buffers.
Result<bool> Tiers::make_host(const std::vector<const Schedule*>& plans) {
  for (auto [s, region] : {std::pair{State::param16, &host_param_}, {State::grad16, &host_grad_},
                           {State::optim32, &host_optim_}}) {
    if (tier(s) != Tier::cpu) continue;
    if (!region->make(state_bytes(s)))
      return make_error("host memory: cannot map " + format_bytes(double(state_bytes(s))) + " for " + to_string(s));
    if (Result<bool> r = pin_host(region->p, region->bytes); !r) return r;
  }
  for (const Schedule* p : plans) arena_[size_t(Tier::cpu)] = std::max(arena_[size_t(Tier::cpu)], std::size_t(p->arena_bytes[size_t(Tier::cpu)]));
  const std::size_t bytes = align_to(arena_[size_t(Tier::cpu)], kPage);
  if (bytes == 0) return true;
  io::PinnedPoolOptions po;
  po.budget_bytes = bytes;
  po.slab_bytes = bytes;
  po.require_lock = false;
  Result<std::unique_ptr<io::PinnedPool>> pool = io::PinnedPool::create(po);
  if (!pool) return make_error("pinned memory: " + pool.error());
  pool_ = std::move(pool).value();
  Result<io::PinnedBuffer> buf = pool_->try_acquire(bytes);
  if (!buf) return make_error("pinned memory: " + buf.error());
  pinned_ = std::move(buf).value();
  arena_base_[size_t(Tier::cpu)] = static_cast<char*>(pinned_.data());
  if (Result<bool> r = pin_host(pinned_.data(), pinned_.size()); !r) return r;
  if (ioe_)
    if (io::Status st = ioe_->register_buffers(pool_->regions()); !st) return make_error("io engine: " + st.error());
  return true;
}

Result<bool> Tiers::make(Backend& be, const std::vector<const Schedule*>& plans) {
  be_ = &be;
  if (Result<bool> r = make_swap_files(); !r) return r;
  if (Result<bool> r = make_device(plans); !r) return r;
  return make_host(plans);
}

Result<bool> Tiers::pin_host(void* p, std::size_t bytes) {
  if (!be_->ops().host_register) return true;  // the cpu backend's device memory is host memory already
  Result<bool> r = be_->ops().host_register(be_->ctx(), p, bytes);
  if (!r) return make_error("host memory: " + r.error());
  registered_.push_back(p);
  return true;
}

// Initial states (Sec. 7.2): this rank makes only the elements it keeps, from the counter-based
// initialiser, so no rank ever holds a whole parameter outside a gathered buffer (unless the
// placement keeps it whole) and the assembled weights equal a one-rank run's bit for bit.
void Tiers::init_values(const UnitLayout& u, std::size_t from, std::size_t count, float* out) const {
  const ParamGroup& g = groups_[u.group];
  const int tiles = g.linear ? o_->config.tiling_factor : 1;
  gpt_init_group(model_, o_->seed, g, tiles, std::size_t(std::max(0, u.tile)) * u.elems + from, count, out);
}

Result<bool> Tiers::round_params(adam::CpuAdam& adam, const float* src, void* dst, std::size_t count) const {
  if (o_->precision == adam::DType::fp32) {
    std::memcpy(dst, src, count * 4);
    return true;
  }
  Result<std::size_t> r = adam.convert(src, dst, o_->precision, count);
  if (!r) return make_error(r.error());
  return true;
}

void Tiers::upload(State s, std::size_t byte_off, const void* src, std::size_t bytes) {
  char* dst = state_ptr(s) + byte_off;
  if (tier(s) == Tier::gpu) {
    be_->ops().copy_h2d_async(be_->ctx(), 0, dst, src, bytes);
    be_->ops().synchronize(be_->ctx());
  } else {
    std::memcpy(dst, src, bytes);
  }
}

// Each element is made once: a unit's values over the span both states need of it (its shard,
// or all of it where either keeps it whole), then the master's part and the 16-bit part cut from
// them (made for each state apart, initialisation took 60 % of a short NVMe run's time).
Result<bool> Tiers::initialise(adam::CpuAdam& adam) {
  const std::size_t n_opt = elems_of(State::optim32);
  const bool opt_nvme = tier(State::optim32) == Tier::nvme, opt_part = sharded(State::optim32);
  const bool p_part = sharded(State::param16) || tier(State::param16) == Tier::nvme;
  // optimizer states on NVMe: a chunk's record is [master | m | v] over its pieces, written once
  // its units have filled every piece (units come in the chunks' order: one record is open at a time)
  struct Slot {
    std::size_t chunk, at;
    const PieceLayout* piece;
  };
  std::vector<std::vector<Slot>> slots(units_.size());
  std::vector<std::unique_ptr<AlignedBuffer>> records(chunks_.size()), spare;
  std::vector<std::size_t> missing(chunks_.size(), 0);
  std::size_t record_bytes = 0;
  for (const ChunkLayout& ch : chunks_) record_bytes = std::max(record_bytes, 12 * ch.count);
  // a written record's memory makes the next one (a new allocation for each faulted its pages in
  // again: 3.4x the page faults of the whole run)
  auto open_record = [&](std::size_t c) {
    if (spare.empty()) {
      records[c] = std::make_unique<AlignedBuffer>(record_bytes);
    } else {
      records[c] = std::move(spare.back());
      spare.pop_back();
      std::memset(records[c]->p, 0, align_to(std::max<std::size_t>(12 * chunks_[c].count, 1), kPage));
    }
  };
  auto write_record = [&](std::size_t c) -> Result<bool> {
    if (!records[c]) open_record(c);
    Result<bool> r = wait(swap_optim_->write(c, records[c]->p));
    spare.push_back(std::move(records[c]));
    return r;
  };
  if (opt_nvme)
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      std::size_t at = 0;
      for (const PieceLayout& pc : chunks_[c].pieces) {
        slots[pc.unit].push_back({c, at, &pc});
        at += pc.count;
      }
      missing[c] = at;
      if (at == 0)
        if (Result<bool> r = write_record(c); !r) return r;
    }
  std::vector<float> master(opt_nvme ? 0 : n_opt);
  for (std::size_t i = 0; i < units_.size(); ++i) {
    const UnitLayout& u = units_[i];
    const std::size_t o_from = opt_part ? u.from : 0, o_len = opt_len(u);
    const std::size_t p_from = p_part ? u.from : 0, p_len = p_part ? u.len : u.elems;
    const std::size_t from = std::min(o_from, p_from), to = std::max(o_from + o_len, p_from + p_len);
    if (to <= from) continue;
    std::vector<float> v(to - from);
    init_values(u, from, v.size(), v.data());
    if (!opt_nvme) std::memcpy(master.data() + opt_at(u), v.data() + (o_from - from), o_len * 4);
    for (const Slot& sl : slots[i]) {
      if (!records[sl.chunk]) open_record(sl.chunk);
      std::memcpy(reinterpret_cast<float*>(records[sl.chunk]->p) + sl.at, v.data() + (o_from + sl.piece->from - from),
                  sl.piece->count * 4);
      if ((missing[sl.chunk] -= sl.piece->count) == 0)
        if (Result<bool> r = write_record(sl.chunk); !r) return r;
    }
    if (p_len == 0) continue;
    // 16-bit parameters, laid out as param16 is (shards or whole units)
    AlignedBuffer p16(p_len * psz_);
    if (Result<bool> r = round_params(adam, v.data() + (p_from - from), p16.p, p_len); !r) return r;
    if (tier(State::param16) == Tier::nvme) {
      if (Result<bool> r = wait(swap_param_->write(i, p16.p)); !r) return r;
    } else {
      upload(State::param16, (sharded(State::param16) ? u.part_at : u.whole_at) * psz_, p16.p, p_len * psz_);
    }
  }
  for (std::size_t c = 0; c < chunks_.size(); ++c)
    if (missing[c] != 0) return make_error("optimizer chunk " + std::to_string(c) + ": its pieces do not match its units");
  if (!opt_nvme) {
    const std::vector<float> zeros(n_opt, 0.0f);
    upload(State::optim32, 0, master.data(), n_opt * 4);
    upload(State::optim32, n_opt * 4, zeros.data(), n_opt * 4);
    upload(State::optim32, 2 * n_opt * 4, zeros.data(), n_opt * 4);
  }
  if (tier(State::grad16) != Tier::nvme) {
    std::vector<char> z(elems_of(State::grad16) * psz_, 0);
    upload(State::grad16, 0, z.data(), z.size());
  }
  be_->ops().synchronize(be_->ctx());
  return true;
}

Result<std::vector<float>> Tiers::master_slices() {
  const std::size_t n_opt = elems_of(State::optim32);
  std::vector<float> part(n_opt);
  if (tier(State::optim32) == Tier::nvme) {
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      AlignedBuffer buf(12 * chunks_[c].count);
      if (Result<bool> r = wait(swap_optim_->read(c, buf.p)); !r) return make_error(r.error());
      std::memcpy(part.data() + chunks_[c].start, buf.p, chunks_[c].count * 4);
    }
  } else if (tier(State::optim32) == Tier::gpu) {
    be_->ops().copy_d2h_async(be_->ctx(), 0, part.data(), state_ptr(State::optim32), n_opt * 4);
    be_->ops().synchronize(be_->ctx());
  } else {
    std::memcpy(part.data(), host_optim_.p, n_opt * 4);
  }
  return part;
}

Result<std::vector<char>> Tiers::read_state(State st) {
  std::vector<char> out;
  if (tier(st) == Tier::nvme && st == State::param16) {
    for (std::size_t i = 0; i < units_.size(); ++i) {
      const std::size_t len = units_[i].len * psz_;
      AlignedBuffer buf(len);
      if (len > 0)
        if (Result<bool> r = wait(swap_param_->read(i, buf.p)); !r) return make_error(r.error());
      out.insert(out.end(), buf.p, buf.p + len);
    }
    return out;
  }
  if (tier(st) == Tier::nvme) {  // optim32: chunk records [master | m | v] into three arrays
    const std::size_t n_opt = elems_of(State::optim32);
    out.resize(12 * n_opt);
    float* a = reinterpret_cast<float*>(out.data());
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const ChunkLayout& ch = chunks_[c];
      AlignedBuffer buf(12 * ch.count);
      if (Result<bool> r = wait(swap_optim_->read(c, buf.p)); !r) return make_error(r.error());
      const float* f = reinterpret_cast<const float*>(buf.p);
      for (int k = 0; k < 3; ++k) std::copy_n(f + k * ch.count, ch.count, a + k * n_opt + ch.start);
    }
    return out;
  }
  out.resize(state_bytes(st));
  if (tier(st) == Tier::gpu) {
    be_->ops().copy_d2h_async(be_->ctx(), 0, out.data(), state_ptr(st), out.size());
    be_->ops().synchronize(be_->ctx());
  } else {
    std::memcpy(out.data(), state_ptr(st), out.size());
  }
  return out;
}

Result<bool> Tiers::write_state(State st, const std::vector<char>& in) {
  if (tier(st) == Tier::nvme && st == State::param16) {
    std::size_t at = 0;
    for (std::size_t i = 0; i < units_.size(); ++i) {
      const std::size_t len = units_[i].len * psz_;
      if (len == 0) continue;
      AlignedBuffer buf(len);
      std::memcpy(buf.p, in.data() + at, len);
      if (Result<bool> r = wait(swap_param_->write(i, buf.p)); !r) return r;
      at += len;
    }
    return true;
  }
  if (tier(st) == Tier::nvme) {
    const std::size_t n_opt = elems_of(State::optim32);
    const float* a = reinterpret_cast<const float*>(in.data());
    for (std::size_t c = 0; c < chunks_.size(); ++c) {
      const ChunkLayout& ch = chunks_[c];
      AlignedBuffer buf(12 * ch.count);
      float* f = reinterpret_cast<float*>(buf.p);
      for (int k = 0; k < 3; ++k) std::copy_n(a + k * n_opt + ch.start, ch.count, f + k * ch.count);
      if (Result<bool> r = wait(swap_optim_->write(c, buf.p)); !r) return r;
    }
    return true;
  }
  if (tier(st) == Tier::gpu) {
    be_->ops().copy_h2d_async(be_->ctx(), 0, state_ptr(st), in.data(), in.size());
    be_->ops().synchronize(be_->ctx());
  } else {
    std::memcpy(state_ptr(st), in.data(), in.size());
  }
  return true;
}

std::uint64_t Tiers::state_size(State st) const {
  if (st == State::optim32) return 12 * elems_of(State::optim32);
  if (tier(st) == Tier::nvme) {
    std::uint64_t n = 0;
    for (const UnitLayout& u : units_) n += u.len;
    return n * psz_;
  }
  return state_bytes(st);
}

}  // namespace memwall::exec
