// The engine: tiers, handlers per step kind, and the dispatcher that runs a schedule's steps as
// their dependencies complete (ENGINE-NOTES.md, "Recommended structure": an admission cursor that
// reserves memory strictly in schedule order, issue out of order when dependencies are done,
// completions polled, first error wins and the rest drains).
#include "exec/engine/engine.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include <nlohmann/json.hpp>

#include "exec/adam/cpu_adam.hpp"
#include "exec/backend/half.hpp"
#include "exec/engine/arena.hpp"
#include "exec/engine/collectives.hpp"
#include "exec/io/pinned_pool.hpp"
#include "exec/io/swap_file.hpp"
#include "exec/io/temp_file.hpp"
#include "model/units.hpp"

namespace memwall::exec {

using Clock = std::chrono::steady_clock;

MemorySizes executor_sizes(const GptConfig& model, const TrainingConfig& config, adam::DType precision,
                           int micro_batches) {
  MemorySizes z;
  z.param_bytes = double(adam::dtype_bytes(precision));
  z.optim_bytes = 12;  // fp32 master, momentum, variance: CPU Adam reads 16-bit gradients directly
  z.act_bytes = 4;     // activations and checkpoints are fp32 (the kernels compute in fp32)
  z.workspace_bytes = double(GptOps::workspace_bytes(model, int(config.bsz), int(config.seq), config.ci,
                                                     micro_batches, config.tiling_factor));
  return z;
}

Result<MemorySizes> schedule_sizes(const HardwareProfile& profile, const ModelSpec& model, const Placement& placement,
                                   const TrainingConfig& config) {
  if (profile.executor_backend.empty()) return MemorySizes{};
  Result<adam::DType> precision = adam::parse_dtype(profile.executor_precision);
  if (!precision) return make_error(profile.source + ": executor.precision: " + precision.error());
  const GptConfig g{model.layers, int(model.hidden), model.heads, int(model.seq), int(model.vocab)};
  return executor_sizes(g, config, *precision, placement.layer_major ? std::max(1, config.micro_batches) : 1);
}


namespace {

constexpr std::size_t kDeviceAlign = 256;
constexpr std::size_t kPage = io::kIoAlignment;
std::size_t align_to(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

// Host work (CPU Adam) beside the dispatcher, one task at a time in order.
struct HostTask {
  std::atomic<bool> done{false};
  std::string error;
};
class HostLane {
 public:
  HostLane() : thread_([this] { loop(); }) {}
  ~HostLane() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  std::shared_ptr<HostTask> post(std::function<std::string()> fn) {
    auto t = std::make_shared<HostTask>();
    {
      std::lock_guard lock(m_);
      q_.push_back({t, std::move(fn)});
    }
    cv_.notify_all();
    return t;
  }

 private:
  void loop() {
    std::unique_lock lock(m_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !q_.empty(); });
      if (q_.empty()) return;
      auto [task, fn] = std::move(q_.front());
      q_.pop_front();
      lock.unlock();
      std::string e = fn();
      task->error = std::move(e);
      task->done.store(true, std::memory_order_release);
      lock.lock();
    }
  }
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<HostTask>, std::function<std::string()>>> q_;
  bool stop_ = false;
  std::thread thread_;
};

// Page-aligned host memory for model states kept in CPU memory (zeroed by mmap).
struct HostRegion {
  char* p = nullptr;
  std::size_t bytes = 0;
  HostRegion() = default;
  HostRegion(const HostRegion&) = delete;
  HostRegion& operator=(const HostRegion&) = delete;
  ~HostRegion() {
    if (p) ::munmap(p, bytes);
  }
  bool make(std::size_t n) {
    bytes = align_to(std::max<std::size_t>(n, 1), kPage);
    void* m = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return false;
    p = static_cast<char*>(m);
    return true;
  }
};

// A 4096-aligned host buffer for O_DIRECT transfers outside the pinned arena (initialisation).
struct AlignedBuffer {
  char* p = nullptr;
  explicit AlignedBuffer(std::size_t n) : p(static_cast<char*>(std::aligned_alloc(kPage, align_to(n, kPage)))) {
    if (p) std::memset(p, 0, align_to(n, kPage));
  }
  ~AlignedBuffer() { std::free(p); }
};

// (group, tile): what one fetch moves and one gradient offload drains. A state kept whole on every
// rank lays units out one after another (whole_at); a partitioned one keeps this rank's part of
// each (part_at): elements [from, from + len) of the unit, a 1/dp shard (bandwidth-centric,
// from = rank * shard), or all of it or nothing (the broadcast variant: the units this rank owns).
struct Unit {
  std::string name;       // "block0.fc1[tile 1]", as the schedule names it
  std::size_t group = 0;  // index into groups
  int tile = -1;
  std::size_t elems = 0;  // whole
  std::size_t shard = 0;  // elems / dp: what an all-gather moves per rank
  int root = -1;          // broadcast variant: the rank that owns it
  std::size_t from = 0, len = 0;  // this rank's part
  std::size_t whole_at = 0, part_at = 0;
};
// Part of a unit's optimizer slice (its shard when optim32 is partitioned, else all of it) inside
// one optimizer chunk.
struct Piece {
  std::size_t unit = 0, from = 0, count = 0;  // elements into the slice
};
struct ChunkPlan {
  std::size_t start = 0, count = 0;  // elements of the partition
  std::vector<Piece> pieces;
  // the chunk buffer (pinned): states [master | m | v] then each piece's gradient then each piece's
  // updated 16-bit parameters, every part on a 4096-byte boundary so it goes to NVMe as it is
  std::vector<std::size_t> grad_at, param_at;  // byte offsets into the buffer, per piece
  std::size_t bytes = 0;
};

struct Token {
  enum Kind { none, event, io, host, collective } kind = none;
  Event ev = nullptr;
  io::IoHandle handle;
  std::shared_ptr<HostTask> task;
  std::vector<std::unique_ptr<CollectiveOp>> ops;
};

struct Live {
  Tier tier = Tier::gpu;
  std::size_t offset = 0;
  char* ptr = nullptr;
};

std::string describe(const Step& s) { return "step " + std::to_string(s.id) + " (" + step_label(s) + ")"; }

std::uint64_t fnv1a(const char* p, std::size_t n) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 0x100000001b3ull;
  return h;
}

// Writes `path` through `path.tmp`, fsync and rename, then fsyncs the folder: after a crash the
// file is either the old one or the whole new one.
Result<bool> write_durably(const std::string& path, const char* data, std::size_t n) {
  const std::string tmp = path + ".tmp";
  const io::TempFileGuard guard(tmp);  // gone after the rename; removed on an error or a signal before it
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return make_error("write " + tmp + ": " + std::strerror(errno));
  std::size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, data + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string e = std::strerror(errno);
      ::close(fd);
      return make_error("write " + tmp + ": offset " + std::to_string(done) + ": " + e);
    }
    done += std::size_t(w);
  }
  if (::fsync(fd) != 0) {
    const std::string e = std::strerror(errno);
    ::close(fd);
    return make_error("fsync " + tmp + ": " + e);
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return make_error("rename " + tmp + " -> " + path + ": " + std::strerror(errno));
  const std::string folder = std::filesystem::path(path).parent_path().string();
  if (const int d = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
    ::fsync(d);
    ::close(d);
  }
  return true;
}

Result<std::vector<char>> read_whole(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(path + ": " + std::strerror(errno));
  std::vector<char> out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const std::string e = std::strerror(errno);
      ::close(fd);
      return make_error("read " + path + ": offset " + std::to_string(out.size()) + ": " + e);
    }
    if (r == 0) break;
    out.insert(out.end(), buf, buf + r);
  }
  ::close(fd);
  return out;
}

}  // namespace

struct Engine::Impl {
  EngineOptions o;
  Schedule sched;
  std::unique_ptr<Backend> be;
  std::unique_ptr<GptOps> gpt;
  Stream h2d = 0, d2h = 0;
  int rank = 0, dp = 1;
  std::unique_ptr<Collectives> coll;  // dp > 1: MPI (cpu) or NCCL (cuda)
  std::unique_ptr<Collectives> boot;  // the MPI collectives NCCL was bootstrapped over
  std::vector<int> collective_order;  // the schedule's collective steps, in schedule order
  std::vector<ParamGroup> groups;
  std::vector<Unit> units;
  std::map<std::string, std::size_t> unit_by_name;
  std::size_t n_whole = 0, n_part = 0;  // parameters: all of them, this rank's shards
  std::size_t psz = 2;                  // bytes per param16 / grad16 element
  int micro_batches = 1;
  std::vector<ChunkPlan> chunks;
  std::size_t chunk_slot = 0;  // every chunk buffer takes the largest chunk's layout: slots that rotate
  std::vector<int> step_chunk;  // optimizer-phase steps: their chunk
  // dpu: the ordinary schedule of the warm-up steps and the delayed update's, swapped in turn with
  // `sched` (the one the dispatcher runs) and its derived tables
  struct Alternate {
    Schedule sched;
    std::vector<int> step_chunk, collective_order;
  };
  std::optional<Alternate> other;
  bool dpu_active = false, skip_update = false;

  // tiers
  void* device_block = nullptr;
  Arena dev;
  std::size_t dev_budget = 0;  // the schedule's GPU peak: admission never goes beyond it
  std::unique_ptr<io::PinnedPool> pool;
  io::PinnedBuffer pinned;
  Arena pin;
  std::size_t pin_budget = 0;
  HostRegion host_param, host_grad, host_optim;
  std::unique_ptr<io::IoEngine> ioe;
  std::optional<io::SwapFile> swap_param, swap_grad, swap_optim;
  // Swap files this engine made: removed when it ends, however it ends, and on SIGINT/SIGTERM/SIGHUP.
  std::vector<std::unique_ptr<io::TempFileGuard>> swap_guards;
  std::size_t dev_param = 0, dev_grad = 0, dev_optim = 0;  // arena offsets of device-resident states
  std::size_t dev_workspace = 0;
  std::vector<void*> registered;  // host memory registered with the backend

  std::unique_ptr<adam::CpuAdam> adam;
  std::unique_ptr<HostLane> lane;
  long adam_step = 0;
  int iteration = 0;
  std::map<std::string, Live> live;
  std::vector<Event> event_pool;
  std::vector<float> grads_kept;  // the optimizer slices' order
  std::array<double, kLinkClasses> bytes_moved{};

  ~Impl() {
    if (be) be->ops().synchronize(be->ctx());
    if (ioe) (void)ioe->wait_all();
    swap_guards.clear();
    lane.reset();
    coll.reset();
    if (be) {
      for (Event e : event_pool) be->ops().event_destroy(be->ctx(), e);
      gpt.reset();
      if (device_block) be->ops().free(be->ctx(), device_block);
      if (be->ops().host_unregister)
        for (void* p : registered) be->ops().host_unregister(be->ctx(), p);
    }
  }

  const BackendOps& k() const { return be->ops(); }
  void* cx() const { return be->ctx(); }
  Tier tier(State s) const { return o.placement.of(s).tier; }
  bool sharded(State s) const { return o.placement.of(s).partitioned && dp > 1; }

  // ---- layout ----------------------------------------------------------------------------------
  int tiles_of(const ParamGroup& g) const { return g.linear ? o.config.tiling_factor : 1; }

  Result<bool> lay_out_units() {
    groups = gpt_param_groups(o.model);
    // The broadcast variant's owners are the schedule's (every unit's reduce or bcast names it).
    const bool broadcast = o.placement.fetch == ParamFetch::broadcast && dp > 1;
    std::map<std::string, int> roots;
    for (const Step& st : sched.steps)
      if (st.root >= 0) roots[st.op] = st.root;
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      const ParamGroup& g = groups[gi];
      const int t = tiles_of(g);
      for (int i = 0; i < t; ++i) {
        Unit u;
        u.name = g.name + (t > 1 ? "[tile " + std::to_string(i) + "]" : "");
        u.group = gi;
        u.tile = t > 1 ? i : -1;
        u.elems = g.elems / std::size_t(t);
        if (!broadcast && u.elems % std::size_t(dp) != 0)
          return make_error("--dp " + std::to_string(dp) + ": the " + std::to_string(u.elems) + " parameters of " +
                            u.name + " do not split evenly over " + std::to_string(dp) +
                            " ranks (choose a data-parallel degree that divides the hidden size)");
        u.shard = u.elems / std::size_t(dp);
        if (broadcast) {
          auto r = roots.find(u.name);
          if (r == roots.end()) return make_error("internal error: the schedule names no owner for " + u.name);
          u.root = r->second;
          u.from = 0;
          u.len = u.root == rank ? u.elems : 0;
        } else {
          u.from = std::size_t(rank) * u.shard;
          u.len = u.shard;
        }
        u.whole_at = n_whole;
        u.part_at = n_part;
        n_whole += u.elems;
        n_part += u.len;
        unit_by_name[u.name] = units.size();
        units.push_back(u);
      }
    }
    return true;
  }
  std::size_t elems_of(State s) const { return sharded(s) ? n_part : n_whole; }
  std::size_t opt_len(const Unit& u) const { return sharded(State::optim32) ? u.len : u.elems; }
  std::size_t opt_at(const Unit& u) const { return sharded(State::optim32) ? u.part_at : u.whole_at; }

  Result<bool> plan_chunks() {
    std::size_t at = 0, ui = 0, in_unit = 0;
    const std::size_t n_opt = elems_of(State::optim32);
    for (const Schedule::Chunk& c : sched.optimizer_chunks) {
      ChunkPlan p;
      p.start = std::size_t(c.start);
      p.count = std::size_t(c.params);
      if (double(p.start) != c.start || double(p.count) != c.params || p.start != at)
        return make_error("internal error: optimizer chunk at " + std::to_string(c.start) + " is not whole parameters");
      std::size_t left = p.count;
      while (left > 0 && ui < units.size()) {
        const std::size_t take = std::min(left, opt_len(units[ui]) - in_unit);
        p.pieces.push_back({ui, in_unit, take});
        left -= take;
        in_unit += take;
        if (in_unit == opt_len(units[ui])) ++ui, in_unit = 0;
      }
      std::size_t b = align_to(12 * p.count, kPage);
      for (const Piece& pc : p.pieces) {
        if (tier(State::grad16) == Tier::nvme) {
          p.grad_at.push_back(b);
          b += align_to(pc.count * psz, kPage);
        }
      }
      for (const Piece& pc : p.pieces) {
        if (tier(State::param16) == Tier::nvme) {
          p.param_at.push_back(b);
          b += align_to(pc.count * psz, kPage);
        }
      }
      p.bytes = b;
      chunk_slot = std::max(chunk_slot, b);
      at += p.count;
      chunks.push_back(std::move(p));
    }
    if (at != n_opt) return make_error("internal error: optimizer chunks cover " + std::to_string(at) + " of " +
                                       std::to_string(n_opt) + " parameters");
    step_chunk = chunk_of_steps(sched);
    return true;
  }

  static std::vector<int> chunk_of_steps(const Schedule& sc) {
    std::vector<int> out(sc.steps.size(), -1);
    int last = -1;
    for (const Step& s : sc.steps) {
      if (s.phase != Phase::optimizer) continue;
      const auto lb = s.op.find("[chunk ");
      if (lb != std::string::npos) last = std::stoi(s.op.substr(lb + 7));
      else if (s.op == "adam") last = 0;
      // "grads" comes before chunk 0; "params" refreshes name their buffer, after their chunk
      const auto staged = s.src_buf.rfind("params16:", 0) == 0 ? std::stoi(s.src_buf.substr(9)) : -1;
      out[size_t(s.id)] = staged >= 0 ? staged : last;
    }
    return out;
  }
  static std::vector<int> collectives_of(const Schedule& sc) {
    std::vector<int> out;
    for (const Step& st : sc.steps)
      if (is_collective(st)) out.push_back(st.id);
    return out;
  }
  // dpu: the delayed update's schedule from step warmup + 1 on (its first iteration has no pending
  // gradients: its updates only copy the parameters), the ordinary one before.
  void choose_schedule() {
    if (!other) return;
    const bool want = iteration >= o.config.dpu_warmup;
    skip_update = false;
    if (want == dpu_active) return;
    std::swap(sched, other->sched);
    std::swap(step_chunk, other->step_chunk);
    std::swap(collective_order, other->collective_order);
    dpu_active = want;
    skip_update = want;
  }

  std::size_t state_bytes(State s) const { return s == State::optim32 ? 12 * elems_of(s) : psz * elems_of(s); }

  // Where a state resident in memory (device or host) starts.
  char* state_ptr(State s) {
    const Tier t = tier(s);
    if (t == Tier::gpu) return dev.at(s == State::param16 ? dev_param : s == State::grad16 ? dev_grad : dev_optim);
    if (t == Tier::cpu) return (s == State::param16 ? host_param : s == State::grad16 ? host_grad : host_optim).p;
    return nullptr;
  }
  // This rank's part of unit u (a partitioned state), or all of u (a whole one).
  char* unit_in(State s, const Unit& u) { return state_ptr(s) + (sharded(s) ? u.part_at : u.whole_at) * psz; }
  // Element j of u's optimizer slice in a 16-bit state laid out as that state is.
  char* slice_in(State s, const Unit& u, std::size_t j) {
    const std::size_t at = sharded(s) ? u.part_at + j
                                      : u.whole_at + (sharded(State::optim32) ? u.from : 0) + j;
    return state_ptr(s) + at * psz;
  }

  Result<const Unit*> unit(const std::string& name) const {
    auto it = unit_by_name.find(name);
    if (it == unit_by_name.end()) return make_error("internal error: the schedule names a parameter unit \"" + name +
                                                    "\" the GPT does not have");
    return &units[it->second];
  }
  Result<char*> buffer(const std::string& name) const {
    auto it = live.find(name);
    if (it == live.end()) return make_error("internal error: buffer " + name + " is not allocated");
    return it->second.ptr;
  }

  // Every rank must run the same schedule with the same collectives, or the job would hang or mix
  // data: a hash of what every rank must agree on, compared across ranks before step 0 (as
  // DeepSpeed's assert_ints_same_as_other_ranks).
  Result<bool> check_ranks_agree() {
    std::uint64_t h = 0xcbf29ce484222325ull;
    auto mixin = [&h](const std::string& text) {
      for (unsigned char ch : text) h = (h ^ ch) * 0x100000001b3ull;
    };
    mixin(std::to_string(o.model.layers) + "/" + std::to_string(o.model.hidden) + "/" + std::to_string(o.model.heads) +
          "/" + std::to_string(o.model.max_seq) + "/" + std::to_string(o.model.vocab));
    for (State st : {State::param16, State::grad16, State::optim32, State::act_ckpt})
      mixin(std::string(to_string(tier(st))) + (o.placement.of(st).partitioned ? "p" : "w"));
    mixin(format_g(o.config.bsz) + "/" + std::to_string(o.config.ci) + "/" + std::to_string(o.config.tiling_factor) +
          "/" + std::to_string(o.config.prefetch_depth) + "/" + std::to_string(o.config.micro_batches) + "/" +
          std::string(adam::dtype_name(o.precision)) + "/" + std::to_string(o.seed) + "/" + format_g(o.lr));
    for (int id : collective_order) {
      const Step& st = sched.steps[size_t(id)];
      // what every rank's call must agree on; a broadcast's bytes differ by rank (its root receives none)
      mixin(step_label(st) + "/" + std::to_string(st.root) + (st.root < 0 ? "/" + format_g(st.bytes) : ""));
    }
    Result<std::vector<std::uint64_t>> all = coll->all_gather_u64(h);
    if (!all) return make_error(all.error());
    for (std::size_t r = 1; r < all->size(); ++r)
      if ((*all)[r] != (*all)[0])
        return make_error("rank " + std::to_string(r) + " runs another model, placement, training config or schedule "
                          "than rank 0 (give every rank the same flags, run config and plan)");
    return true;
  }

  // ---- creation ------------------------------------------------------------------------------
  // Admission: the memory model (model/memory.hpp) for this rank at the executor's sizes says
  // whether every tier and the pinned budget hold what the schedule will allocate, and what fills
  // them; the schedule's walk sizes the pinned pool.
  Result<bool> check_fit(const Schedule& sched, const TrainingConfig& config, const MemorySizes& sizes) {
    const std::string hint = "; run `memwall plan` for a placement, batch, checkpoint interval and tiling that fit";
    TrainingConfig c = config;
    c.dp = sched.dp;
    const MemoryModel mm = memory_model(gpt_model_spec(o.model), o.placement, c, o.profile, sched.rank, sizes);
    auto parts = [](const TierMemory& tm) {
      std::string out;
      for (const MemoryPart& p : tm.parts) out += (out.empty() ? "" : ", ") + p.what + " " + format_bytes(p.bytes);
      return out;
    };
    for (Tier t : {Tier::gpu, Tier::cpu, Tier::nvme}) {
      const TierMemory& tm = mm.of(t);
      if (tm.fits() && !(sched.overflow && sched.overflow->tier == t)) continue;
      std::string why = sched.overflow ? sched.overflow->message
                                       : std::string("out of memory on ") + to_string(t) + ": needs " +
                                             format_bytes(tm.peak_bytes) + ", capacity " +
                                             format_bytes(tm.capacity_bytes) + " per rank";
      return make_error("does not fit: " + why + " (" + (tm.moment.empty() ? "" : "at the " + tm.moment + ": ") +
                        parts(tm) + ")" + hint);
    }
    const double pinned = pinned_per_rank(c, o.profile);
    if (mm.cpu_buffer_bytes > pinned + 0.5)
      return make_error("pinned budget too small: the schedule's CPU buffers need " + format_bytes(mm.cpu_buffer_bytes) +
                        " (" + std::to_string(std::llround(mm.cpu_buffer_bytes)) + " bytes) at once (" +
                        parts(mm.of(Tier::cpu)) + "), the profile " + o.profile.name + " gives " +
                        format_bytes(pinned) + " per GPU (cpu.pinned_budget)");
    double transient = sched.peak_bytes[int(Tier::cpu)];
    for (double b : sched.persistent_bytes[int(Tier::cpu)]) transient -= b;
    pin_budget = std::max(pin_budget, std::size_t(std::llround(std::max(0.0, transient))));
    return true;
  }

  Result<bool> check_nvme_dir(std::size_t need) {
    if (o.nvme_dir.empty()) {
      std::string which;
      for (State s : {State::param16, State::grad16, State::optim32})
        if (tier(s) == Tier::nvme) which += (which.empty() ? "" : ", ") + std::string(to_string(s));
      return make_error("--nvme-dir: needed because " + which + " live on nvme (a folder on the drive to swap to)");
    }
    std::error_code ec;
    if (!std::filesystem::is_directory(o.nvme_dir, ec))
      return make_error("--nvme-dir " + o.nvme_dir + ": not a folder");
    const std::string probe = o.nvme_dir + "/.memwall-write-test-" + std::to_string(::getpid());
    FILE* f = std::fopen(probe.c_str(), "w");
    if (!f) return make_error("--nvme-dir " + o.nvme_dir + ": not writable: " + std::strerror(errno));
    std::fclose(f);
    std::filesystem::remove(probe, ec);
    struct statvfs vs {};
    if (::statvfs(o.nvme_dir.c_str(), &vs) != 0)
      return make_error("--nvme-dir " + o.nvme_dir + ": statvfs: " + std::strerror(errno));
    const double free_bytes = double(vs.f_bavail) * double(vs.f_frsize);
    if (double(need) > free_bytes)
      return make_error("--nvme-dir " + o.nvme_dir + ": the swap files need " + format_bytes(double(need)) + " (" +
                        std::to_string(need) + " bytes), " + format_bytes(free_bytes) + " are free");
    return true;
  }

  Result<bool> make_tiers() {
    // swap files first: their size is checked against the folder before anything is allocated
    std::vector<std::uint64_t> unit_bytes, chunk_bytes;  // NVMe states are partitioned (validate says so)
    for (const Unit& u : units) unit_bytes.push_back(u.len * psz);
    for (const ChunkPlan& c : chunks) chunk_bytes.push_back(12 * c.count);
    std::size_t swap_need = 0;
    auto slots = [](const std::vector<std::uint64_t>& v) {
      std::size_t s = 0;
      for (std::uint64_t b : v) s += io::align_up(b);
      return s;
    };
    if (tier(State::param16) == Tier::nvme) swap_need += slots(unit_bytes);
    if (tier(State::grad16) == Tier::nvme) swap_need += slots(unit_bytes);
    if (tier(State::optim32) == Tier::nvme) swap_need += slots(chunk_bytes);
    if (swap_need > 0) {
      Result<bool> ok = check_nvme_dir(swap_need);
      if (!ok) return ok;
      Result<std::unique_ptr<io::IoEngine>> e = io::make_engine(io::EngineKind::uring, o.io);
      if (!e) return make_error("io engine: " + e.error());
      ioe = std::move(e).value();
      auto make = [&](const char* state, const std::vector<std::uint64_t>& shards,
                      std::optional<io::SwapFile>& out) -> Result<bool> {
        Result<std::string> path = io::swap_file_path(o.nvme_dir, rank, state);
        if (!path) return make_error(path.error());
        // guarded before it exists: a signal during the preallocation removes it too
        swap_guards.push_back(std::make_unique<io::TempFileGuard>(*path));
        Result<io::SwapFile> f = io::SwapFile::create(*ioe, o.nvme_dir, rank, state, shards);
        if (!f) return make_error("--nvme-dir: " + f.error());  // create removed a file it could not fill
        out = std::move(f).value();
        return true;
      };
      if (tier(State::param16) == Tier::nvme)
        if (Result<bool> r = make("param16", unit_bytes, swap_param); !r) return r;
      if (tier(State::grad16) == Tier::nvme)
        if (Result<bool> r = make("grad16", unit_bytes, swap_grad); !r) return r;
      if (tier(State::optim32) == Tier::nvme)
        if (Result<bool> r = make("optim32", chunk_bytes, swap_optim); !r) return r;
    }

    // device: one block, the schedule's peak plus room for alignment and fragmentation
    BackendOptions bo;
    bo.capacity_bytes = std::size_t(o.profile.gpu_memory_bytes);
    bo.compute = o.compute;
    if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK"); local && o.backend == "cuda")
      bo.device = std::atoi(local);  // one GPU per rank of a node
    Result<std::unique_ptr<Backend>> b = create_backend(o.backend, bo);
    if (!b) return make_error("backend: " + b.error());
    be = std::move(b).value();
    if (double(be->caps().capacity_bytes) < sched.peak_bytes[int(Tier::gpu)])
      return make_error("device: " + be->caps().device + " has " + format_bytes(double(be->caps().capacity_bytes)) +
                        " free, the schedule needs " + format_bytes(sched.peak_bytes[int(Tier::gpu)]) +
                        " (the profile says " + format_bytes(o.profile.gpu_memory_bytes) + ")");
    dev_budget = std::size_t(std::ceil(sched.peak_bytes[int(Tier::gpu)]));
    if (other) dev_budget = std::max(dev_budget, std::size_t(std::ceil(other->sched.peak_bytes[int(Tier::gpu)])));
    const std::size_t capacity = be->caps().capacity_bytes;
    // live bytes never exceed the budget; the room beyond it absorbs fragmentation
    const std::size_t want = std::min(capacity, std::max(2 * dev_budget, dev_budget + (std::size_t(64) << 20)));
    Result<void*> block = k().alloc(cx(), want);
    if (!block) return make_error("device: " + block.error());
    device_block = *block;
    char* base = reinterpret_cast<char*>(align_to(reinterpret_cast<std::uintptr_t>(*block), kDeviceAlign));
    dev = Arena(base, want - std::size_t(base - static_cast<char*>(*block)), kDeviceAlign);
    auto device_state = [&](State s, std::size_t& off) -> Result<bool> {
      if (tier(s) != Tier::gpu) return true;
      std::optional<std::size_t> at = dev.allocate(state_bytes(s));
      if (!at) return make_error("device: no room for " + std::string(to_string(s)) + " (" + dev.describe() + ")");
      off = *at;
      return true;
    };
    for (auto [s, off] : {std::pair{State::param16, &dev_param}, {State::grad16, &dev_grad}, {State::optim32, &dev_optim}})
      if (Result<bool> r = device_state(s, *off); !r) return r;
    const std::size_t ws = std::size_t(sched.sizes.workspace_bytes);
    std::optional<std::size_t> w = dev.allocate(ws);
    if (!w) return make_error("device: no room for the activation workspace (" + dev.describe() + ")");
    dev_workspace = *w;
    Result<std::unique_ptr<GptOps>> g =
        GptOps::create(*be, o.model, int(o.config.bsz), int(o.config.seq), o.config.ci, micro_batches,
                       o.config.tiling_factor, dev.at(dev_workspace), ws);
    if (!g) return make_error(g.error());
    gpt = std::move(g).value();
    Result<Stream> s1 = k().stream_create(cx()), s2 = k().stream_create(cx());
    if (!s1 || !s2) return make_error("backend: cannot create copy streams");
    h2d = *s1;
    d2h = *s2;

    // host: model states in CPU memory, and the pinned arena for the schedule's CPU buffers
    for (auto [s, region] : {std::pair{State::param16, &host_param}, {State::grad16, &host_grad},
                             {State::optim32, &host_optim}}) {
      if (tier(s) != Tier::cpu) continue;
      if (!region->make(state_bytes(s)))
        return make_error("host memory: cannot map " + format_bytes(double(state_bytes(s))) + " for " + to_string(s));
      if (Result<bool> r = pin_host(region->p, region->bytes); !r) return r;
    }
    if (pin_budget > 0) {
      // room for the 4 KiB alignment each buffer needs on top of what the schedule counts
      const std::size_t bytes = align_to(pin_budget + pin_budget / 8 + (std::size_t(1) << 20), kPage);
      io::PinnedPoolOptions po;
      po.budget_bytes = bytes;
      po.slab_bytes = bytes;
      po.require_lock = false;
      Result<std::unique_ptr<io::PinnedPool>> p = io::PinnedPool::create(po);
      if (!p) return make_error("pinned memory: " + p.error());
      pool = std::move(p).value();
      Result<io::PinnedBuffer> buf = pool->try_acquire(bytes);
      if (!buf) return make_error("pinned memory: " + buf.error());
      pinned = std::move(buf).value();
      pin = Arena(static_cast<char*>(pinned.data()), pinned.size(), kPage);
      if (Result<bool> r = pin_host(pinned.data(), pinned.size()); !r) return r;
      if (ioe)
        if (io::Status st = ioe->register_buffers(pool->regions()); !st) return make_error("io engine: " + st.error());
    }
    return true;
  }

  Result<bool> pin_host(void* p, std::size_t bytes) {
    if (!k().host_register) return true;  // the cpu backend's device memory is host memory already
    Result<bool> r = k().host_register(cx(), p, bytes);
    if (!r) return make_error("host memory: " + r.error());
    registered.push_back(p);
    return true;
  }

  // Initial states (Sec. 7.2): this rank makes only the elements it keeps, from the counter-based
  // initialiser, so no rank ever holds a whole parameter outside a gathered buffer (unless the
  // placement keeps it whole) and the assembled weights equal a one-rank run's bit for bit.
  // Master parameters from the seed, moments zero, the 16-bit copy rounded from the master.
  void init_values(const Unit& u, std::size_t from, std::size_t count, float* out) const {
    const ParamGroup& g = groups[u.group];
    gpt_init_group(o.model, o.seed, g, tiles_of(g), std::size_t(std::max(0, u.tile)) * u.elems + from, count, out);
  }
  Result<bool> initialise() {
    // optimizer states: the optimizer slice of each unit
    const std::size_t n_opt = elems_of(State::optim32);
    if (tier(State::optim32) == Tier::nvme) {
      for (std::size_t c = 0; c < chunks.size(); ++c) {
        const ChunkPlan& ch = chunks[c];
        AlignedBuffer buf(12 * ch.count);
        float* m = reinterpret_cast<float*>(buf.p);
        std::size_t at = 0;
        for (const Piece& pc : ch.pieces) {
          const Unit& u = units[pc.unit];
          init_values(u, (sharded(State::optim32) ? u.from : 0) + pc.from, pc.count, m + at);
          at += pc.count;
        }
        if (Result<bool> r = write_wait(swap_optim->write(c, buf.p)); !r) return r;
      }
    } else {
      std::vector<float> master(n_opt), zeros(n_opt, 0.0f);
      for (const Unit& u : units)
        init_values(u, sharded(State::optim32) ? u.from : 0, opt_len(u), master.data() + opt_at(u));
      upload(State::optim32, 0, master.data(), n_opt * 4);
      upload(State::optim32, n_opt * 4, zeros.data(), n_opt * 4);
      upload(State::optim32, 2 * n_opt * 4, zeros.data(), n_opt * 4);
    }
    // 16-bit parameters, laid out as param16 is (shards or whole units)
    const bool p_sharded = sharded(State::param16);
    for (std::size_t i = 0; i < units.size(); ++i) {
      const Unit& u = units[i];
      const bool part = p_sharded || tier(State::param16) == Tier::nvme;
      const std::size_t len = part ? u.len : u.elems;
      if (len == 0) continue;
      std::vector<float> v(len);
      init_values(u, part ? u.from : 0, len, v.data());
      AlignedBuffer p16(len * psz);
      if (Result<bool> r = round_params(v.data(), p16.p, len); !r) return r;
      if (tier(State::param16) == Tier::nvme) {
        if (Result<bool> r = write_wait(swap_param->write(i, p16.p)); !r) return r;
      } else {
        upload(State::param16, (p_sharded ? u.part_at : u.whole_at) * psz, p16.p, len * psz);
      }
    }
    if (tier(State::grad16) != Tier::nvme) {
      std::vector<char> z(elems_of(State::grad16) * psz, 0);
      upload(State::grad16, 0, z.data(), z.size());
    }
    k().synchronize(cx());
    return true;
  }

  Result<bool> round_params(const float* src, void* dst, std::size_t count) {
    if (o.precision == adam::DType::fp32) {
      std::memcpy(dst, src, count * 4);
      return true;
    }
    Result<std::size_t> r = adam->convert(src, dst, o.precision, count);
    if (!r) return make_error(r.error());
    return true;
  }
  void upload(State s, std::size_t byte_off, const void* src, std::size_t bytes) {
    char* dst = state_ptr(s) + byte_off;
    if (tier(s) == Tier::gpu) {
      k().copy_h2d_async(cx(), 0, dst, src, bytes);
      k().synchronize(cx());
    } else {
      std::memcpy(dst, src, bytes);
    }
  }
  Result<bool> write_wait(Result<io::IoHandle> h) {
    if (!h) return make_error(h.error());
    io::Status st = h->wait();
    if (!st) return make_error(st.error());
    return true;
  }

  // ---- admission -----------------------------------------------------------------------------
  // Bytes a buffer takes in its arena: chunk buffers take one slot each, the largest chunk's
  // aligned layout (chunks differ in size: buffers of their own sizes, made and given back in
  // rotation, would fragment the pinned arena until no range fits the next); anything the io engine
  // reads or writes is whole 4096-byte blocks.
  std::size_t layout_bytes(const Step&, const Buffer& b) const {
    if (b.name.rfind("adam[", 0) == 0) return chunk_slot;
    if (b.tier == Tier::cpu) return align_to(std::size_t(std::ceil(b.bytes)), kPage);
    return std::size_t(std::ceil(b.bytes));
  }

  // Reserves the step's buffers; false when its tier is at the schedule's peak or the arena has no
  // range large enough (wait for a release). Nothing is half-reserved.
  bool admit(const Step& s) {
    std::vector<std::pair<std::string, Live>> got;
    for (const Buffer& b : s.allocs) {
      if (b.name == "workspace") continue;  // reserved at creation for the whole run
      Arena& a = b.tier == Tier::gpu ? dev : pin;
      const std::size_t budget = b.tier == Tier::gpu ? dev_budget : pin_budget;
      const std::size_t counted = std::size_t(std::ceil(b.bytes));
      std::optional<std::size_t> at;
      if (a.live_bytes() + counted <= budget + 64) at = a.allocate(layout_bytes(s, b), counted);
      if (!at) {
        for (auto& [name, l] : got) (l.tier == Tier::gpu ? dev : pin).release(l.offset);
        return false;
      }
      got.push_back({b.name, Live{b.tier, *at, a.at(*at)}});
    }
    for (auto& [name, l] : got) {
      if (name.rfind("grad:", 0) == 0) {  // gradients accumulate into it: start from zero
        const Buffer* b = nullptr;
        for (const Buffer& x : s.allocs)
          if (x.name == name) b = &x;
        k().memset_zero(cx(), l.ptr, std::size_t(b->bytes));
      }
      live[name] = l;
    }
    return true;
  }

  void release(const std::string& name) {
    if (name == "workspace") return;
    auto it = live.find(name);
    if (it == live.end()) return;
    (it->second.tier == Tier::gpu ? dev : pin).release(it->second.offset);
    live.erase(it);
  }

  std::string admission_blocked(const Step& s) const {
    std::string out = describe(s) + " cannot get its buffers:";
    for (const Buffer& b : s.allocs) {
      const Arena& a = b.tier == Tier::gpu ? dev : pin;
      out += " " + b.name + " (" + format_bytes(b.bytes) + " on " + to_string(b.tier) + "; " + a.describe() + ")";
    }
    return out + " with nothing in flight to free memory";
  }

  // ---- handlers ------------------------------------------------------------------------------
  Event take_event() {
    if (event_pool.empty()) return k().event_create(cx());
    Event e = event_pool.back();
    event_pool.pop_back();
    return e;
  }
  Token on_stream(Stream s) {
    Token t;
    t.kind = Token::event;
    t.ev = take_event();
    k().event_record(cx(), t.ev, s);
    return t;
  }
  Token io_token(io::IoHandle h) {
    Token t;
    t.kind = Token::io;
    t.handle = std::move(h);
    return t;
  }

  static bool is_collective(const Step& s) {
    return s.kind == StepKind::reduce_scatter || s.kind == StepKind::allreduce ||
           (s.kind == StepKind::fetch && (s.hop == "gg" || s.hop == "bcast"));
  }

  Result<Token> issue(const Step& s) {
    switch (s.kind) {
      case StepKind::fetch:
        if (s.hop == "gg" || s.hop == "bcast") return gather(s);
        return s.phase == Phase::optimizer ? fetch_optimizer(s) : fetch_param(s);
      case StepKind::compute: return compute(s);
      case StepKind::release: return Token{};
      case StepKind::offload: return offload(s);
      case StepKind::save_ckpt: return save_ckpt(s);
      case StepKind::load_ckpt: return load_ckpt(s);
      case StepKind::optimizer: return optimizer(s);
      case StepKind::reduce_scatter:
      case StepKind::allreduce: return reduce(s);
      case StepKind::p2p: break;  // refused at create(): no pipeline stages here
    }
    return make_error(describe(s) + ": unknown step kind");
  }

  Token collective_token(std::vector<std::unique_ptr<CollectiveOp>> ops) {
    Token t;
    t.kind = Token::collective;
    t.ops = std::move(ops);
    return t;
  }

  Result<char*> src_or_state(const Step& s, State st, const Unit& u) {
    if (s.src_buf.empty()) return unit_in(st, u);
    return buffer(s.src_buf);
  }

  Result<Token> fetch_param(const Step& s) {
    Result<const Unit*> u = unit(s.op);
    if (!u) return make_error(u.error());
    Result<char*> dst = buffer(s.dst_buf);
    if (!dst) return make_error(dst.error());
    if (s.hop == "nc") {
      Result<io::IoHandle> h = swap_param->read(unit_by_name.at(s.op), *dst);
      if (!h) return make_error(h.error());
      return io_token(std::move(h).value());
    }
    // cg: this rank's part goes where the gather will expect it in the whole buffer
    Result<char*> src = src_or_state(s, State::param16, **u);
    if (!src) return make_error(src.error());
    const bool part = sharded(State::param16);
    const std::size_t count = part ? (*u)->len : (*u)->elems;
    k().copy_h2d_async(cx(), h2d, *dst + (part ? (*u)->from * psz : 0), *src, count * psz);
    return on_stream(h2d);
  }

  // gg: every rank's shard of a unit into its whole buffer; "params" after the optimizer: every
  // rank's updated part of every unit into the whole param16 on the GPU.
  Result<Token> gather(const Step& s) {
    std::vector<std::unique_ptr<CollectiveOp>> ops;
    if (s.hop == "bcast") {  // the owner's copy of a unit to every rank: into the fetch buffer, or the
                             // updated parameters into param16 on every GPU after the optimizer
      Result<const Unit*> u = unit(s.op);
      if (!u) return make_error(u.error());
      Result<char*> dst = s.phase == Phase::optimizer ? Result<char*>(unit_in(State::param16, **u)) : buffer(s.dst_buf);
      if (!dst) return make_error(dst.error());
      Result<std::unique_ptr<CollectiveOp>> op = coll->broadcast(*dst, (*u)->elems, o.precision, s.root);
      if (!op) return make_error(op.error());
      ops.push_back(std::move(op).value());
      return collective_token(std::move(ops));
    }
    if (s.op == "params") {
      const ChunkPlan& ch = chunks[size_t(step_chunk[size_t(s.id)])];
      for (const Piece& pc : ch.pieces) {
        const Unit& u = units[pc.unit];
        Result<std::unique_ptr<CollectiveOp>> op =
            coll->all_gather(state_ptr(State::param16) + (u.whole_at + pc.from) * psz, pc.count, u.shard, o.precision);
        if (!op) return make_error(op.error());
        ops.push_back(std::move(op).value());
      }
      return collective_token(std::move(ops));
    }
    Result<const Unit*> u = unit(s.op);
    if (!u) return make_error(u.error());
    Result<char*> dst = buffer(s.dst_buf);
    if (!dst) return make_error(dst.error());
    char* mine = *dst + std::size_t(rank) * (*u)->shard * psz;
    if (s.src_buf.empty()) {  // zero3: this rank's shard lives on the GPU; put it in place first
      k().copy_d2d_async(cx(), 0, mine, unit_in(State::param16, **u), (*u)->shard * psz);
      k().synchronize(cx());
    }
    Result<std::unique_ptr<CollectiveOp>> op = coll->all_gather(*dst, (*u)->shard, (*u)->shard, o.precision);
    if (!op) return make_error(op.error());
    ops.push_back(std::move(op).value());
    return collective_token(std::move(ops));
  }

  // rs: a gradient buffer summed over ranks, this rank's shard to its grad16 on the GPU or left in
  // the buffer's own slice for the offload; ar: summed in place (whole gradients, data_parallel).
  Result<Token> reduce(const Step& s) {
    if (s.hop == "mp") return make_error(describe(s) + ": tensor slicing is not executed");
    Result<const Unit*> u = unit(s.op);
    if (!u) return make_error(u.error());
    Result<char*> buf = src_or_state(s, State::grad16, **u);
    if (!buf) return make_error(buf.error());
    Result<std::unique_ptr<CollectiveOp>> op = make_error("");
    if (s.hop == "reduce") {  // the broadcast variant: the sum lands on the owner only
      op = coll->reduce(*buf, (*u)->elems, o.precision, s.root);
    } else if (s.kind == StepKind::allreduce) {
      op = coll->all_reduce(*buf, (*u)->elems, o.precision);
    } else {
      char* out = *buf + std::size_t(rank) * (*u)->shard * psz;
      if (s.dst_buf.empty()) out = unit_in(State::grad16, **u);
      op = coll->reduce_scatter(*buf, out, (*u)->shard, o.precision);
    }
    if (!op) return make_error(op.error());
    std::vector<std::unique_ptr<CollectiveOp>> ops;
    ops.push_back(std::move(op).value());
    return collective_token(std::move(ops));
  }

  Result<Token> fetch_optimizer(const Step& s) {
    const ChunkPlan& ch = chunks[size_t(step_chunk[size_t(s.id)])];
    if (s.op == "params" && s.hop == "cg") {  // updated 16-bit parameters back to the GPU, piece by piece
      Result<char*> src = buffer(s.src_buf);
      if (!src) return make_error(src.error());
      std::size_t at = 0;
      for (const Piece& pc : ch.pieces) {
        k().copy_h2d_async(cx(), h2d, slice_in(State::param16, units[pc.unit], pc.from), *src + at * psz,
                           pc.count * psz);
        at += pc.count;
      }
      return on_stream(h2d);
    }
    Result<char*> buf = buffer(s.dst_buf);
    if (!buf) return make_error(buf.error());
    if (s.state == State::optim32) {
      Result<io::IoHandle> h = swap_optim->read(size_t(step_chunk[size_t(s.id)]), *buf);
      if (!h) return make_error(h.error());
      return io_token(std::move(h).value());
    }
    // gradients of the chunk's pieces, each from its unit's slot
    std::vector<io::IoRequest> rq;
    for (std::size_t i = 0; i < ch.pieces.size(); ++i) {
      const Piece& pc = ch.pieces[i];
      const io::SwapShard& sh = swap_grad->shard(pc.unit);
      rq.push_back({io::IoOp::read, swap_grad->file(), sh.offset + pc.from * psz, *buf + ch.grad_at[i],
                    io::align_up(pc.count * psz)});
    }
    return io_token(ioe->submit(rq));
  }

  Result<Token> compute(const Step& s) {
    Result<OpRef> op = parse_op(o.model, s.op);
    if (!op) return make_error(describe(s) + ": " + op.error());
    OpCall c;
    c.op = *op;
    c.tile = s.tile;
    c.tiles = s.tile >= 0 ? o.config.tiling_factor : 1;
    c.micro_batch = std::max(0, s.micro_batch);
    c.recompute = s.phase == Phase::recompute;
    const bool backward = s.phase == Phase::backward;
    const bool mixed = o.precision != adam::DType::fp32;
    std::size_t elems = 0;
    char* grad_target = nullptr;
    if (!op->group.empty()) {
      const std::string uname = op->group + (s.tile >= 0 ? "[tile " + std::to_string(s.tile) + "]" : "");
      Result<const Unit*> u = unit(uname);
      if (!u) return make_error(u.error());
      elems = (*u)->elems;
      // the whole unit: fetched into a buffer, or resident whole (at dp 1 a shard is the whole)
      Result<char*> w = src_or_state(s, State::param16, **u);
      if (!w) return make_error(w.error());
      if (mixed) {
        k().to_fp32(cx(), gpt->weight_staging(), *w, o.precision, long(elems));
        c.params = gpt->weight_staging();
      } else {
        c.params = reinterpret_cast<const float*>(*w);
      }
      if (backward) {
        if (s.dst_buf.empty()) {
          grad_target = unit_in(State::grad16, **u);
        } else {
          Result<char*> b = buffer(s.dst_buf);
          if (!b) return make_error(b.error());
          grad_target = *b;
        }
        if (mixed) {
          k().memset_zero(cx(), gpt->grad_staging(), elems * 4);
          c.grads = gpt->grad_staging();
        } else {
          c.grads = reinterpret_cast<float*>(grad_target);
        }
      }
    }
    if (backward) gpt->backward(c);
    else gpt->forward(c);
    if (backward && mixed && grad_target) k().accumulate_to(cx(), grad_target, gpt->grad_staging(), o.precision, long(elems));
    return on_stream(0);
  }

  Result<Token> offload(const Step& s) {
    if (s.phase == Phase::optimizer) {
      if (s.op == "grads") {  // this rank's gradients to CPU memory, for CPU Adam: its optimizer slices
        Result<char*> dst = buffer(s.dst_buf);
        if (!dst) return make_error(dst.error());
        for (const Unit& u : units)
          k().copy_d2h_async(cx(), d2h, *dst + opt_at(u) * psz, slice_in(State::grad16, u, 0), opt_len(u) * psz);
        return on_stream(d2h);
      }
      const int ci = step_chunk[size_t(s.id)];
      const ChunkPlan& ch = chunks[size_t(ci)];
      Result<char*> buf = buffer(s.src_buf);
      if (!buf) return make_error(buf.error());
      if (s.state == State::optim32) {
        Result<io::IoHandle> h = swap_optim->write(size_t(ci), *buf);
        if (!h) return make_error(h.error());
        return io_token(std::move(h).value());
      }
      std::vector<io::IoRequest> rq;
      for (std::size_t i = 0; i < ch.pieces.size(); ++i) {
        const Piece& pc = ch.pieces[i];
        const io::SwapShard& sh = swap_param->shard(pc.unit);
        rq.push_back({io::IoOp::write, swap_param->file(), sh.offset + pc.from * psz, *buf + ch.param_at[i],
                      io::align_up(pc.count * psz)});
      }
      return io_token(ioe->submit(rq));
    }
    // a gradient leaving the GPU (gc), then the drive (cn)
    Result<const Unit*> u = unit(s.op);
    if (!u) return make_error(u.error());
    Result<char*> src = buffer(s.src_buf);
    if (!src) return make_error(src.error());
    if (s.hop == "gc") {
      char* dst = nullptr;
      if (s.dst_buf.empty()) {
        dst = unit_in(State::grad16, **u);
      } else {
        Result<char*> b = buffer(s.dst_buf);
        if (!b) return make_error(b.error());
        dst = *b;
      }
      // after a reduce-scatter this rank's shard sits in its slice of the buffer
      const bool part = sharded(State::grad16);
      const std::size_t count = part ? (*u)->len : (*u)->elems;
      k().copy_d2h_async(cx(), d2h, dst, *src + (part ? (*u)->from * psz : 0), count * psz);
      return on_stream(d2h);
    }
    Result<io::IoHandle> h = swap_grad->write(unit_by_name.at(s.op), *src);
    if (!h) return make_error(h.error());
    return io_token(std::move(h).value());
  }

  static int block_of(const std::string& op) { return std::stoi(op.substr(5, op.find('.') - 5)); }

  Result<Token> save_ckpt(const Step& s) {
    Result<char*> dst = buffer(s.dst_buf);
    if (!dst) return make_error(dst.error());
    const int u = std::max(0, s.micro_batch);
    const float* src = gpt->block_input(block_of(s.op), u);
    const std::size_t bytes = std::size_t(s.bytes);
    // the copy reads what the compute stream wrote: it waits for it
    Event ready = take_event();
    k().event_record(cx(), ready, 0);
    k().stream_wait_event(cx(), d2h, ready);
    event_pool.push_back(ready);
    if (s.dst == Tier::gpu) {
      k().copy_d2d_async(cx(), d2h, *dst, src, bytes);
    } else {
      k().copy_d2h_async(cx(), d2h, *dst, src, bytes);
    }
    return on_stream(d2h);
  }

  Result<Token> load_ckpt(const Step& s) {
    Result<char*> src = buffer(s.src_buf);
    if (!src) return make_error(src.error());
    const int u = std::max(0, s.micro_batch);
    if (s.src == Tier::gpu) {
      gpt->set_segment_input(u, reinterpret_cast<const float*>(*src));
      return Token{};
    }
    Result<char*> dst = buffer(s.dst_buf);
    if (!dst) return make_error(dst.error());
    k().copy_h2d_async(cx(), h2d, *dst, *src, std::size_t(s.bytes));
    gpt->set_segment_input(u, reinterpret_cast<const float*>(*dst));
    return on_stream(h2d);
  }

  Result<Token> optimizer(const Step& s) {
    if (s.src == Tier::gpu) return optimizer_on_device();
    const ChunkPlan& ch = chunks[size_t(step_chunk[size_t(s.id)])];
    char* buf = nullptr;
    if (!s.src_buf.empty()) {
      Result<char*> b = buffer(s.src_buf);
      if (!b) return make_error(b.error());
      buf = *b;
    }
    char* staged_params = nullptr;  // param16 on the GPU: the chunk's updated copy goes there first
    if (tier(State::param16) == Tier::gpu) {
      Result<char*> b = buffer("params16:" + std::to_string(step_chunk[size_t(s.id)]));
      if (!b) return make_error(b.error());
      staged_params = *b;
    }
    char* staged_grads = nullptr;
    if (tier(State::grad16) == Tier::gpu) {
      Result<char*> b = buffer("grads16");
      if (!b) return make_error(b.error());
      staged_grads = *b;
    }
    const long step = adam_step;
    const bool skip = skip_update;
    Token t;
    t.kind = Token::host;
    t.task = lane->post([this, &ch, buf, staged_params, staged_grads, step, skip]() -> std::string {
      return update_chunk(ch, buf, staged_params, staged_grads, step, skip);
    });
    return t;
  }

  // CPU Adam over one chunk, piece by piece (a piece's gradient and 16-bit copy may sit in their own
  // aligned slots of the chunk buffer, or in a state laid out whole). Runs on the host lane.
  // `skip`: dpu's first delayed iteration has no pending gradients; its updates only copy the
  // parameters (rounded from the masters) for the refresh to bring to the GPU.
  std::string update_chunk(const ChunkPlan& ch, char* buf, char* staged_params, char* staged_grads, long step,
                           bool skip) {
    const Tier ot = tier(State::optim32), gt = tier(State::grad16), pt = tier(State::param16);
    const std::size_t n_opt = elems_of(State::optim32);
    float* base = reinterpret_cast<float*>(host_optim.p);
    float* master = ot == Tier::nvme ? reinterpret_cast<float*>(buf) : base + ch.start;
    float* m = ot == Tier::nvme ? master + ch.count : base + n_opt + ch.start;
    float* v = ot == Tier::nvme ? master + 2 * ch.count : base + 2 * n_opt + ch.start;
    std::size_t done = 0;
    for (std::size_t i = 0; i < ch.pieces.size(); ++i) {
      const Piece& pc = ch.pieces[i];
      const Unit& u = units[pc.unit];
      const char* g = gt == Tier::nvme  ? buf + ch.grad_at[i]
                      : gt == Tier::cpu ? slice_in(State::grad16, u, pc.from)
                                        : staged_grads + (ch.start + done) * psz;
      char* p16 = pt == Tier::nvme  ? buf + ch.param_at[i]
                  : pt == Tier::cpu ? slice_in(State::param16, u, pc.from)
                                    : staged_params + done * psz;
      adam::AdamChunk a;
      a.param = master + done;
      a.exp_avg = m + done;
      a.exp_avg_sq = v + done;
      a.grad = g;
      a.grad_dtype = o.precision;
      a.param16 = o.precision == adam::DType::fp32 ? nullptr : p16;
      a.param16_dtype = o.precision;
      a.n = pc.count;
      if (skip) {
        if (Result<bool> r = round_params(a.param, p16, pc.count); !r) return "adam: " + r.error();
        done += pc.count;
        continue;
      }
      if (o.keep_gradients) keep_gradients(g, ch.start + done, pc.count);
      Result<std::size_t> r = adam->step(a, step);
      if (!r) return "adam: " + r.error();
      if (o.precision == adam::DType::fp32) std::memcpy(p16, a.param, pc.count * 4);
      done += pc.count;
    }
    return "";
  }

  void keep_gradients(const void* g, std::size_t at, std::size_t count) {
    if (o.precision == adam::DType::fp32) {
      std::memcpy(grads_kept.data() + at, g, count * 4);
      return;
    }
    // widened exactly: every 16-bit value is an fp32 value
    auto* src = static_cast<const std::uint16_t*>(g);
    for (std::size_t i = 0; i < count; ++i) grads_kept[at + i] = half::f32_from_half(src[i], o.precision);
  }

  // Adam on the device over this rank's optimizer slices, unit by unit (param16 may be laid out
  // whole while the states are partitioned).
  Result<Token> optimizer_on_device() {
    if (!k().adam_update) return make_error("the " + be->caps().name + " backend has no device Adam");
    const std::size_t n_opt = elems_of(State::optim32);
    float* master = reinterpret_cast<float*>(state_ptr(State::optim32));
    if (o.keep_gradients) {
      std::vector<char> g(psz);
      for (const Unit& u : units) {
        g.resize(opt_len(u) * psz);
        k().copy_d2h_async(cx(), 0, g.data(), slice_in(State::grad16, u, 0), g.size());
        k().synchronize(cx());
        keep_gradients(g.data(), opt_at(u), opt_len(u));
      }
    }
    for (const Unit& u : units) {
      DeviceAdam a;
      a.param = master + opt_at(u);
      a.exp_avg = master + n_opt + opt_at(u);
      a.exp_avg_sq = master + 2 * n_opt + opt_at(u);
      a.grad = slice_in(State::grad16, u, 0);
      a.grad_type = o.precision;
      a.param16 = o.precision == adam::DType::fp32 ? nullptr : slice_in(State::param16, u, 0);
      a.param16_type = o.precision;
      a.n = opt_len(u);
      a.step = adam_step;
      a.lr = o.lr;
      a.beta1 = o.beta1;
      a.beta2 = o.beta2;
      a.eps = o.eps;
      a.weight_decay = o.weight_decay;
      a.decoupled_weight_decay = true;
      k().adam_update(cx(), a);
      if (o.precision == adam::DType::fp32)
        k().copy_d2d_async(cx(), 0, slice_in(State::param16, u, 0), a.param, opt_len(u) * 4);
    }
    return on_stream(0);
  }

  // ---- completion ----------------------------------------------------------------------------
  // nullopt: still running; "" done; else the error.
  std::optional<std::string> poll(Token& t) {
    switch (t.kind) {
      case Token::none: return std::string();
      case Token::event:
        if (!k().event_query(cx(), t.ev)) return std::nullopt;
        event_pool.push_back(t.ev);
        t.ev = nullptr;
        return std::string();
      case Token::io: {
        if (!t.handle.done()) return std::nullopt;
        io::Status st = t.handle.wait();
        return st ? std::string() : st.error();
      }
      case Token::host:
        if (!t.task->done.load(std::memory_order_acquire)) return std::nullopt;
        return t.task->error;
      case Token::collective:
        for (std::unique_ptr<CollectiveOp>& op : t.ops) {
          if (!op) continue;
          Result<bool> r = op->test();
          if (!r) return r.error();
          if (!*r) return std::nullopt;
          op.reset();
        }
        return std::string();
    }
    return std::string();
  }

  // ---- the dispatcher ------------------------------------------------------------------------
  Result<bool> run(std::vector<StepTime>& times, std::array<double, kTiers>& peak) {
    const std::vector<Step>& steps = sched.steps;
    const std::size_t count = steps.size();
    enum : std::uint8_t { waiting, admitted, issued, done };
    std::vector<std::uint8_t> state(count, waiting);
    std::vector<Token> tok(count);
    times.assign(count, StepTime{});
    std::vector<int> ready_list, inflight;  // admitted and not issued; issued and not done
    std::size_t cursor = 0, finished = 0, next_collective = 0;  // collectives go strictly in order
    std::string error;
    const auto t0 = Clock::now();
    auto now = [&] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
    double last_progress = 0;
    int backoff_us = 1;
    bytes_moved = {};
    const std::size_t dev_hw0 = dev.high_water_bytes(), pin_hw0 = pin.high_water_bytes();
    (void)dev_hw0;
    (void)pin_hw0;
    std::size_t dev_peak = dev.live_bytes(), pin_peak = pin.live_bytes();
    while (finished < count) {
      bool progress = false;
      // admission, strictly in schedule order
      while (error.empty() && cursor < count && !(o.serial && (!inflight.empty() || !ready_list.empty()))) {
        if (!admit(steps[cursor])) break;
        dev_peak = std::max(dev_peak, dev.live_bytes());
        pin_peak = std::max(pin_peak, pin.live_bytes());
        state[cursor] = admitted;
        ready_list.push_back(int(cursor++));
        progress = true;
      }
      // issue whatever has its dependencies done
      for (auto it = ready_list.begin(); error.empty() && it != ready_list.end();) {
        const Step& s = steps[size_t(*it)];
        bool deps_done = true;
        for (int d : s.deps) deps_done = deps_done && state[size_t(d)] == done;
        const bool coll_step = is_collective(s);
        if (coll_step && (next_collective >= collective_order.size() || collective_order[next_collective] != s.id))
          deps_done = false;  // every rank issues its collectives in the same order: the schedule's
        if (!deps_done || (o.serial && !inflight.empty())) {
          if (o.serial) break;
          ++it;
          continue;
        }
        times[size_t(s.id)] = {s.id, now(), 0};
        Result<Token> t = issue(s);
        if (!t) {
          error = describe(s) + ": " + t.error();
          break;
        }
        tok[size_t(s.id)] = std::move(t).value();
        if (coll_step) ++next_collective;
        state[size_t(s.id)] = issued;
        inflight.push_back(s.id);
        it = ready_list.erase(it);
        progress = true;
      }
      // completions
      for (std::size_t i = 0; i < inflight.size();) {
        const int id = inflight[i];
        std::optional<std::string> r = poll(tok[size_t(id)]);
        if (!r) {
          ++i;
          continue;
        }
        const Step& s = steps[size_t(id)];
        times[size_t(id)].end_s = now();
        if (!r->empty() && error.empty()) error = describe(s) + ": " + *r;
        if (r->empty()) {
          if (s.link != LinkClass::none && s.bytes > 0) bytes_moved[int(s.link)] += s.bytes;
          for (const std::string& name : s.frees) release(name);
          state[size_t(id)] = done;
          ++finished;
        }
        inflight.erase(inflight.begin() + long(i));
        progress = true;
      }
      if (k().sticky_error)
        if (const char* e = k().sticky_error(cx()); e && error.empty()) error = be->caps().name + ": " + e;
      if (!error.empty() && inflight.empty()) break;
      if (progress) {
        last_progress = now();
        backoff_us = 1;
        continue;
      }
      if (inflight.empty()) {
        if (error.empty())
          error = cursor < count ? admission_blocked(steps[cursor])
                                 : "internal error: steps wait for dependencies that never run";
        break;
      }
      if (now() - last_progress > o.stall_timeout_s) {
        std::string what;
        for (int id : inflight) what += (what.empty() ? "" : ", ") + describe(steps[size_t(id)]);
        error = "stalled: nothing completed for " + format_sig(o.stall_timeout_s) + " s; in flight: " + what;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(backoff_us));
      backoff_us = std::min(200, backoff_us * 2);
    }
    if (!error.empty()) {
      // drain what is in flight so no buffer is written after we return; then report
      k().synchronize(cx());
      if (ioe) (void)ioe->wait_all();
      for (int id : inflight)
        if (tok[size_t(id)].kind == Token::host)
          while (!tok[size_t(id)].task->done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      for (const auto& [name, l] : std::map<std::string, Live>(live)) release(name);
      return make_error(error);
    }
    peak[int(Tier::gpu)] = double(dev_peak);
    peak[int(Tier::cpu)] = double(pin_peak + host_param.bytes * (host_param.p != nullptr) +
                                  host_grad.bytes * (host_grad.p != nullptr) + host_optim.bytes * (host_optim.p != nullptr));
    peak[int(Tier::nvme)] = double(swap_bytes());
    return true;
  }

  // Values laid out as the optimizer slices are (this rank's), back in the parameter array's order;
  // with partitioned states every rank's slices are summed into place (zeros elsewhere), so every
  // rank gets the whole array.
  Result<std::vector<float>> assemble(const std::vector<float>& slices) {
    Impl& e = *this;
    std::vector<float> tiled(e.n_whole, 0.0f);
    for (const Unit& u : e.units) {
      const std::size_t at = u.whole_at + (e.sharded(State::optim32) ? u.from : 0);
      std::copy_n(slices.begin() + long(e.opt_at(u)), e.opt_len(u), tiled.begin() + long(at));
    }
    if (e.sharded(State::optim32))
      if (Result<bool> r = e.coll->all_reduce_sum_host(tiled.data(), tiled.size()); !r) return make_error(r.error());
    std::vector<float> flat(e.n_whole);
    for (const ParamGroup& g : e.groups) {
      const Unit& u0 = e.units[e.unit_by_name.at(g.name + (e.tiles_of(g) > 1 ? "[tile 0]" : ""))];
      from_tile_major(g, e.tiles_of(g), tiled.data() + u0.whole_at, flat.data() + g.offset);
    }
    return flat;
  }

  // ---- checkpoints -----------------------------------------------------------------------------
  // A state as a checkpoint stores it: param16 = this rank's kept elements of every unit, in unit
  // order; optim32 = master, momentum, variance, each over this rank's optimizer slices.
  Result<std::vector<char>> read_state(State st) {
    std::vector<char> out;
    if (tier(st) == Tier::nvme && st == State::param16) {
      for (std::size_t i = 0; i < units.size(); ++i) {
        const std::size_t len = units[i].len * psz;
        AlignedBuffer buf(len);
        if (len > 0)
          if (Result<bool> r = write_wait(swap_param->read(i, buf.p)); !r) return make_error(r.error());
        out.insert(out.end(), buf.p, buf.p + len);
      }
      return out;
    }
    if (tier(st) == Tier::nvme) {  // optim32: chunk records [master | m | v] into three arrays
      const std::size_t n_opt = elems_of(State::optim32);
      out.resize(12 * n_opt);
      float* a = reinterpret_cast<float*>(out.data());
      for (std::size_t c = 0; c < chunks.size(); ++c) {
        const ChunkPlan& ch = chunks[c];
        AlignedBuffer buf(12 * ch.count);
        if (Result<bool> r = write_wait(swap_optim->read(c, buf.p)); !r) return make_error(r.error());
        const float* f = reinterpret_cast<const float*>(buf.p);
        for (int k3 = 0; k3 < 3; ++k3) std::copy_n(f + k3 * ch.count, ch.count, a + k3 * n_opt + ch.start);
      }
      return out;
    }
    out.resize(state_bytes(st));
    if (tier(st) == Tier::gpu) {
      k().copy_d2h_async(cx(), 0, out.data(), state_ptr(st), out.size());
      k().synchronize(cx());
    } else {
      std::memcpy(out.data(), state_ptr(st), out.size());
    }
    return out;
  }

  Result<bool> write_state(State st, const std::vector<char>& in) {
    if (tier(st) == Tier::nvme && st == State::param16) {
      std::size_t at = 0;
      for (std::size_t i = 0; i < units.size(); ++i) {
        const std::size_t len = units[i].len * psz;
        if (len == 0) continue;
        AlignedBuffer buf(len);
        std::memcpy(buf.p, in.data() + at, len);
        if (Result<bool> r = write_wait(swap_param->write(i, buf.p)); !r) return r;
        at += len;
      }
      return true;
    }
    if (tier(st) == Tier::nvme) {
      const std::size_t n_opt = elems_of(State::optim32);
      const float* a = reinterpret_cast<const float*>(in.data());
      for (std::size_t c = 0; c < chunks.size(); ++c) {
        const ChunkPlan& ch = chunks[c];
        AlignedBuffer buf(12 * ch.count);
        float* f = reinterpret_cast<float*>(buf.p);
        for (int k3 = 0; k3 < 3; ++k3) std::copy_n(a + k3 * n_opt + ch.start, ch.count, f + k3 * ch.count);
        if (Result<bool> r = write_wait(swap_optim->write(c, buf.p)); !r) return r;
      }
      return true;
    }
    if (tier(st) == Tier::gpu) {
      k().copy_h2d_async(cx(), 0, state_ptr(st), in.data(), in.size());
      k().synchronize(cx());
    } else {
      std::memcpy(state_ptr(st), in.data(), in.size());
    }
    return true;
  }

  std::uint64_t state_size(State st) const {
    if (st == State::optim32) return 12 * elems_of(State::optim32);
    if (tier(st) == Tier::nvme) {
      std::uint64_t n = 0;
      for (const Unit& u : units) n += u.len;
      return n * psz;
    }
    return state_bytes(st);
  }

  nlohmann::ordered_json identity() const {
    nlohmann::ordered_json place = nlohmann::ordered_json::object();
    for (State st : {State::param16, State::grad16, State::optim32})
      place[to_string(st)] = std::string(to_string(tier(st))) + (o.placement.of(st).partitioned ? "/p" : "");
    place["fetch"] = o.placement.fetch == ParamFetch::broadcast ? "broadcast" : "allgather";
    return {{"layers", o.model.layers},        {"hidden", o.model.hidden},      {"heads", o.model.heads},
            {"seq", o.model.max_seq},          {"vocab", o.model.vocab},        {"dp", dp},
            {"precision", std::string(adam::dtype_name(o.precision))},
            {"tiling_factor", o.config.tiling_factor}, {"placement", place}};
  }

  std::size_t swap_bytes() const {
    std::size_t s = 0;
    for (const auto* f : {&swap_param, &swap_grad, &swap_optim})
      if (*f) s += (*f)->file_bytes();
    return s;
  }
};

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::create(const EngineOptions& options) {
  auto impl = std::make_unique<Impl>();
  Impl& e = *impl;
  e.o = options;
  EngineOptions& o = e.o;
  if (o.capacity_bytes > 0) o.profile.gpu_memory_bytes = double(o.capacity_bytes);
  o.config.seq = o.model.max_seq;
  o.config.mp = std::max(1, o.config.mp);
  if (o.config.mp != 1) return make_error("--mp: the executor runs no tensor slicing (mp 1), got " +
                                          std::to_string(o.config.mp));
  // Ranks are the processes of the job (mpirun -np N), one device each.
  MpiWorld& world = MpiWorld::get();
  e.rank = world.rank();
  e.dp = world.size();
  if (o.config.dp > 0 && o.config.dp != e.dp)
    return make_error("--dp: " + std::to_string(o.config.dp) + " data-parallel ranks asked, this job has " +
                      std::to_string(e.dp) + " (start it with mpirun -np " + std::to_string(o.config.dp) + ")");
  if (o.profile.total_gpus() < e.dp) {
    // a profile `memwall run` executes describes this machine: one device per rank started on it
    if (o.profile.executor_backend.empty() || o.profile.nodes != 1)
      return make_error("--profile " + o.profile.name + ": " + std::to_string(o.profile.total_gpus()) +
                        " GPUs, but this job has " + std::to_string(e.dp) + " ranks (one GPU each)");
    o.profile.gpus_per_node = e.dp;
  }
  o.config.dp = e.dp;
  if (o.config.bsz != std::floor(o.config.bsz) || o.config.bsz < 1)
    return make_error("--bsz: the executor needs a whole micro-batch >= 1, got " + format_g(o.config.bsz));
  if (o.config.pp > 1)
    return make_error("--pp: " + std::to_string(o.config.pp) +
                      " pipeline stages are planned and scheduled; the executor runs every block on each rank (--pp 1)");
  if (o.config.grad_accum > 1)  // its gradient offloads would overwrite, not add to, the earlier micro-steps'
    return make_error("--grad-accum: " + std::to_string(o.config.grad_accum) +
                      " micro-steps per optimizer step is planned and simulated; the executor runs one (use "
                      "--grad-accum 1, or a larger --bsz)");
  e.micro_batches = o.placement.layer_major ? std::max(1, o.config.micro_batches) : 1;
  e.psz = adam::dtype_bytes(o.precision);
  if (o.backend == "cpu" && o.precision == adam::DType::fp16)
    return make_error("precision: the cpu backend stores bf16 or fp32 parameters (fp16 needs loss scaling), got fp16");
  for (const ParamGroup& g : gpt_param_groups(o.model))
    if (g.linear && o.config.tiling_factor > 1 && g.out_features % o.config.tiling_factor != 0)
      return make_error("--tiling: " + std::to_string(o.config.tiling_factor) +
                        " must divide the output features of every linear layer (" + g.name + " has " +
                        std::to_string(g.out_features) + ")");
  Result<Placement> pl = validate(o.placement);
  if (!pl) return make_error(pl.error());

  const MemorySizes sizes = executor_sizes(o.model, o.config, o.precision, e.micro_batches);
  auto schedule_for = [&](const TrainingConfig& c) -> Result<Schedule> {
    Result<Schedule> s = build_schedule(gpt_model_spec(o.model), o.placement, c, o.profile, e.rank, sizes);
    if (!s) return make_error(s.error());
    if (std::vector<std::string> bad = check_invariants(*s); !bad.empty())
      return make_error("internal error: the schedule breaks an invariant: " + bad.front());
    if (Result<bool> r = e.check_fit(*s, c, sizes); !r) return make_error(r.error());
    return s;
  };
  if (o.config.optimizer_overlap == OptimizerOverlap::dpu) {  // warm-up steps run the ordinary schedule
    TrainingConfig plain = o.config;
    plain.optimizer_overlap = OptimizerOverlap::none;
    Result<Schedule> warm = schedule_for(plain);
    if (!warm) return make_error(warm.error());
    e.other = Impl::Alternate{std::move(warm).value(), {}, {}};
  }
  Result<Schedule> s = schedule_for(o.config);
  if (!s) return make_error(s.error());
  e.sched = std::move(s).value();
  if (Result<bool> r = e.lay_out_units(); !r) return make_error(r.error());
  if (Result<bool> r = e.plan_chunks(); !r) return make_error(r.error());
  e.collective_order = Impl::collectives_of(e.sched);
  if (e.other) {
    e.other->step_chunk = Impl::chunk_of_steps(e.other->sched);
    e.other->collective_order = Impl::collectives_of(e.other->sched);
    e.dpu_active = true;
    e.choose_schedule();  // iteration 0: the warm-up schedule
  }
  if (e.dp > 1) {
    Result<std::unique_ptr<Collectives>> c = make_mpi_collectives();
    if (!c) return make_error(c.error());
    e.coll = std::move(c).value();
    if (Result<bool> r = e.check_ranks_agree(); !r) return make_error(r.error());
  }

  adam::AdamOptions ao;
  ao.lr = o.lr;
  ao.beta1 = o.beta1;
  ao.beta2 = o.beta2;
  ao.eps = o.eps;
  ao.weight_decay = o.weight_decay;
  ao.decoupled_weight_decay = true;
  Result<adam::CpuAdam> a = adam::CpuAdam::create(ao);
  if (!a) return make_error("adam: " + a.error());
  e.adam = std::make_unique<adam::CpuAdam>(std::move(a).value());
  e.lane = std::make_unique<HostLane>();
  if (Result<bool> r = e.make_tiers(); !r) return make_error(r.error());
  e.gpt->set_data_parallel(e.dp);
  if (e.dp > 1 && o.backend == "cuda") {  // NCCL between the GPUs, bootstrapped over MPI
    Result<std::unique_ptr<Collectives>> c = make_nccl_collectives(*e.be, *e.coll);
    if (!c) return make_error(c.error());
    e.boot = std::move(e.coll);
    e.coll = std::move(c).value();
  }
  if (Result<bool> r = e.initialise(); !r) return make_error(r.error());
  if (o.keep_gradients) e.grads_kept.assign(e.elems_of(State::optim32), 0.0f);
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

const Schedule& Engine::schedule() const { return impl_->sched; }
const BackendCaps& Engine::backend_caps() const { return impl_->be->caps(); }
std::size_t Engine::num_params() const { return impl_->n_whole; }
int Engine::rank() const { return impl_->rank; }
int Engine::ranks() const { return impl_->dp; }
int Engine::tokens_per_iteration() const {
  return impl_->micro_batches * int(impl_->o.config.bsz) * impl_->o.model.max_seq;
}

Result<IterationReport> Engine::step(const std::vector<int>& tokens, const std::vector<int>& targets) {
  Impl& e = *impl_;
  const std::size_t per_mb = std::size_t(e.o.config.bsz) * std::size_t(e.o.model.max_seq);
  if (tokens.size() != per_mb * std::size_t(e.micro_batches) || targets.size() != tokens.size())
    return make_error("step: expected " + std::to_string(per_mb * std::size_t(e.micro_batches)) +
                      " tokens and targets, got " + std::to_string(tokens.size()));
  for (int t : tokens)
    if (t < 0 || t >= e.o.model.vocab) return make_error("step: token " + std::to_string(t) + " outside the vocabulary");
  for (int t : targets)
    if (t < 0 || t >= e.o.model.vocab) return make_error("step: target " + std::to_string(t) + " outside the vocabulary");
  const auto t0 = Clock::now();
  for (int u = 0; u < e.micro_batches; ++u) {
    e.k().copy_h2d_async(e.cx(), 0, e.gpt->tokens(u), tokens.data() + per_mb * std::size_t(u), per_mb * sizeof(int));
    e.k().copy_h2d_async(e.cx(), 0, e.gpt->targets(u), targets.data() + per_mb * std::size_t(u), per_mb * sizeof(int));
  }
  if (e.tier(State::grad16) == Tier::gpu)
    e.k().memset_zero(e.cx(), e.state_ptr(State::grad16), e.elems_of(State::grad16) * e.psz);
  e.k().synchronize(e.cx());
  e.choose_schedule();
  if (!e.skip_update) ++e.adam_step;
  IterationReport r;
  r.iteration = ++e.iteration;
  Result<bool> ok = e.run(r.times, r.peak_bytes);
  if (!ok) {
    if (!e.skip_update) --e.adam_step;
    --e.iteration;
    return make_error(ok.error());
  }
  e.k().synchronize(e.cx());
  double sum = 0;
  std::vector<float> l(per_mb);
  for (int u = 0; u < e.micro_batches; ++u) {
    e.k().copy_d2h_async(e.cx(), 0, l.data(), e.gpt->losses(u), per_mb * sizeof(float));
    e.k().synchronize(e.cx());
    for (float x : l) sum += x;  // in double on the host: the mean does not depend on a kernel's order
  }
  double mean = sum / double(per_mb * std::size_t(e.micro_batches));
  if (e.dp > 1) {  // the global batch's mean: every rank's mean, averaged
    Result<double> all = e.coll->all_reduce_sum(mean);
    if (!all) return make_error(all.error());
    mean = *all / e.dp;
  }
  r.loss = float(mean);
  r.iteration_s = std::chrono::duration<double>(Clock::now() - t0).count();
  r.bytes_moved = e.bytes_moved;
  r.overlap = overlap_report(e.sched, r.times);
  if (!e.o.trace) r.times.clear();
  return r;
}

Result<std::vector<float>> Engine::master_params() {
  Impl& e = *impl_;
  const std::size_t n_opt = e.elems_of(State::optim32);
  std::vector<float> part(n_opt);
  if (e.tier(State::optim32) == Tier::nvme) {
    for (std::size_t c = 0; c < e.chunks.size(); ++c) {
      AlignedBuffer buf(12 * e.chunks[c].count);
      if (Result<bool> r = e.write_wait(e.swap_optim->read(c, buf.p)); !r) return make_error(r.error());
      std::memcpy(part.data() + e.chunks[c].start, buf.p, e.chunks[c].count * 4);
    }
  } else if (e.tier(State::optim32) == Tier::gpu) {
    e.k().copy_d2h_async(e.cx(), 0, part.data(), e.state_ptr(State::optim32), n_opt * 4);
    e.k().synchronize(e.cx());
  } else {
    std::memcpy(part.data(), e.host_optim.p, n_opt * 4);
  }
  return e.assemble(part);
}

Result<std::vector<float>> Engine::gradients() {
  if (impl_->grads_kept.empty()) return std::vector<float>{};
  return impl_->assemble(impl_->grads_kept);
}

Result<std::vector<float>> Engine::logits() {
  Impl& e = *impl_;
  const std::size_t count = std::size_t(e.o.config.bsz) * std::size_t(e.o.model.max_seq) * std::size_t(e.o.model.vocab);
  std::vector<float> out(count);
  e.k().copy_d2h_async(e.cx(), 0, out.data(), e.gpt->logits(0), count * sizeof(float));
  e.k().synchronize(e.cx());
  return out;
}

Result<bool> Engine::save(const std::string& dir, const RunPosition& at) {
  Impl& e = *impl_;
  if (e.dpu_active)
    return make_error("--save " + dir + ": the delayed parameter update holds step " + std::to_string(at.iteration) +
                      "'s gradients until the next step; a checkpoint would lose them (save within --dpu-warmup)");
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", at.iteration);
  const std::string step_dir = dir + "/" + name;
  std::error_code ec;
  if (e.rank == 0) {
    std::filesystem::create_directories(step_dir, ec);
    if (ec) return make_error("--save " + dir + ": cannot create " + step_dir + ": " + ec.message());
  }
  if (e.dp > 1)
    if (Result<bool> b = e.coll->barrier(); !b) return make_error(b.error());
  std::vector<std::uint64_t> mine;  // bytes and checksum of this rank's two files
  for (State st : {State::param16, State::optim32}) {
    Result<std::vector<char>> bytes = e.read_state(st);
    if (!bytes) return make_error("--save: " + bytes.error());
    char file[48];
    std::snprintf(file, sizeof file, "/rank%04d.%s", e.rank, to_string(st));
    if (Result<bool> w = write_durably(step_dir + file, bytes->data(), bytes->size()); !w) return make_error(w.error());
    mine.push_back(bytes->size());
    mine.push_back(fnv1a(bytes->data(), bytes->size()));
  }
  std::vector<std::vector<std::uint64_t>> all(std::size_t(e.dp));
  for (std::uint64_t v : mine) {
    std::vector<std::uint64_t> g = {v};
    if (e.dp > 1) {
      Result<std::vector<std::uint64_t>> r = e.coll->all_gather_u64(v);
      if (!r) return make_error(r.error());
      g = std::move(r).value();
    }
    for (std::size_t q = 0; q < g.size(); ++q) all[q].push_back(g[q]);
  }
  if (e.o.save_pause_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(e.o.save_pause_s));
  if (e.rank == 0) {
    nlohmann::ordered_json files = nlohmann::ordered_json::array();
    for (int q = 0; q < e.dp; ++q)
      for (int k2 = 0; k2 < 2; ++k2) {
        char file[48];
        std::snprintf(file, sizeof file, "rank%04d.%s", q, k2 == 0 ? "param16" : "optim32");
        files.push_back({{"rank", q}, {"file", file}, {"bytes", all[size_t(q)][size_t(2 * k2)]},
                         {"fnv1a64", all[size_t(q)][size_t(2 * k2 + 1)]}});
      }
    nlohmann::ordered_json m = {{"format", "memwall checkpoint 1"}, {"run", e.identity()},
                                {"iteration", at.iteration},     {"adam_step", e.adam_step},
                                {"data_rng", at.data_rng},       {"files", files}};
    const std::string text = m.dump(1) + "\n";
    if (Result<bool> w = write_durably(step_dir + "/manifest.json", text.data(), text.size()); !w)
      return make_error(w.error());
    const std::string latest = std::string(name) + "\n";
    if (Result<bool> w = write_durably(dir + "/latest", latest.data(), latest.size()); !w) return make_error(w.error());
    // keep the newest two
    std::vector<std::string> steps;
    for (const auto& d : std::filesystem::directory_iterator(dir, ec))
      if (d.is_directory() && d.path().filename().string().rfind("step-", 0) == 0) steps.push_back(d.path().string());
    std::sort(steps.begin(), steps.end());
    for (std::size_t i = 0; i + 2 < steps.size(); ++i) std::filesystem::remove_all(steps[i], ec);
  }
  if (e.dp > 1)
    if (Result<bool> b = e.coll->barrier(); !b) return make_error(b.error());
  return true;
}

Result<RunPosition> Engine::resume(const std::string& dir) {
  Impl& e = *impl_;
  Result<std::vector<char>> latest = read_whole(dir + "/latest");
  if (!latest) return make_error("--resume " + dir + ": no checkpoint (" + latest.error() + ")");
  std::string name(latest->begin(), latest->end());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  const std::string step_dir = dir + "/" + name, mpath = step_dir + "/manifest.json";
  Result<std::vector<char>> mtext = read_whole(mpath);
  if (!mtext) return make_error("--resume: " + mtext.error());
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(mtext->begin(), mtext->end());
  } catch (const std::exception& ex) {
    return make_error(mpath + ": not a memwall checkpoint manifest: " + ex.what());
  }
  if (!m.is_object() || m.value("format", "") != "memwall checkpoint 1")
    return make_error(mpath + ": format: expected \"memwall checkpoint 1\"");
  const nlohmann::json mine = nlohmann::json::parse(e.identity().dump());
  for (auto it = mine.begin(); it != mine.end(); ++it) {
    const nlohmann::json& theirs = m["run"][it.key()];
    if (theirs != it.value())
      return make_error(mpath + ": run." + it.key() + ": the checkpoint has " + theirs.dump() + ", this run " +
                        it.value().dump() + " (resume with the same model, placement, dp, precision and tiling)");
  }
  for (State st : {State::param16, State::optim32}) {
    char file[48];
    std::snprintf(file, sizeof file, "rank%04d.%s", e.rank, to_string(st));
    const nlohmann::json* entry = nullptr;
    for (const nlohmann::json& f : m["files"])
      if (f.value("file", "") == file) entry = &f;
    if (!entry) return make_error(mpath + ": files: no entry for " + file);
    Result<std::vector<char>> bytes = read_whole(step_dir + "/" + file);
    if (!bytes) return make_error("--resume: " + bytes.error());
    const std::uint64_t want = (*entry)["bytes"].get<std::uint64_t>();
    if (bytes->size() != want || want != e.state_size(st))
      return make_error(step_dir + "/" + file + ": " + std::to_string(bytes->size()) + " bytes, the manifest says " +
                        std::to_string(want) + " and this run needs " + std::to_string(e.state_size(st)));
    if (fnv1a(bytes->data(), bytes->size()) != (*entry)["fnv1a64"].get<std::uint64_t>())
      return make_error(step_dir + "/" + file + ": checksum differs from the manifest's (the file is damaged)");
    if (Result<bool> w = e.write_state(st, *bytes); !w) return make_error("--resume: " + w.error());
  }
  e.adam_step = m["adam_step"].get<long>();
  RunPosition at;
  at.iteration = m["iteration"].get<int>();
  at.data_rng = m["data_rng"].get<std::uint64_t>();
  e.iteration = at.iteration;
  return at;
}

Result<std::vector<RankTraffic>> Engine::traffic_by_rank(const IterationReport& r) {
  Impl& e = *impl_;
  std::vector<RankTraffic> out(std::size_t(e.dp));
  for (int c = 0; c < kLinkClasses; ++c)
    for (int which = 0; which < 2; ++which) {
      const double v = which == 0 ? r.bytes_moved[size_t(c)] : e.sched.traffic_bytes[size_t(c)];
      std::vector<std::uint64_t> all = {std::uint64_t(std::llround(v))};
      if (e.dp > 1) {
        Result<std::vector<std::uint64_t>> g = e.coll->all_gather_u64(all[0]);
        if (!g) return make_error(g.error());
        all = std::move(g).value();
      }
      for (std::size_t q = 0; q < all.size(); ++q)
        (which == 0 ? out[q].moved_bytes : out[q].schedule_bytes)[size_t(c)] = double(all[q]);
    }
  return out;
}

EngineStats Engine::stats() const {
  const Impl& e = *impl_;
  EngineStats s;
  s.device_capacity_bytes = e.be->caps().capacity_bytes;
  s.device_high_water_bytes = e.dev.high_water_bytes();
  s.device_extent_bytes = e.dev.extent_high_water();
  s.pinned_high_water_bytes = e.pin.high_water_bytes();
  s.host_state_bytes = e.host_param.bytes * (e.host_param.p != nullptr) + e.host_grad.bytes * (e.host_grad.p != nullptr) +
                       e.host_optim.bytes * (e.host_optim.p != nullptr);
  s.swap_file_bytes = e.swap_bytes();
  if (e.ioe) s.io = e.ioe->counters();
  return s;
}

std::vector<TraceEvent> Engine::trace_events(const IterationReport& r) const {
  std::vector<TraceEvent> out;
  for (const StepTime& t : r.times) {
    const Step& s = impl_->sched.steps[size_t(t.step)];
    std::string track = step_resource(s);
    if (track.empty()) continue;
    if (track == "gpu_compute" || track == "pcie" || track == "nvlink") track = "gpu0 " + track;
    out.push_back({step_label(s), track, t.start_s, t.end_s, s.id, 0});
  }
  return out;
}

}  // namespace memwall::exec
