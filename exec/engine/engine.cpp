// The engine: tiers, handlers per step kind, and the dispatcher that runs a schedule's steps as
// their dependencies complete (ENGINE-NOTES.md, "Recommended structure": an admission cursor that
// reserves memory strictly in schedule order, issue out of order when dependencies are done,
// completions polled, first error wins and the rest drains).
#include "exec/engine/engine.hpp"

#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "exec/adam/cpu_adam.hpp"
#include "exec/backend/half.hpp"
#include "exec/engine/arena.hpp"
#include "exec/io/pinned_pool.hpp"
#include "exec/io/swap_file.hpp"
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

ModelSpec model_spec(const GptConfig& g) {
  ModelSpec m;
  m.name = "gpt";
  m.source = "run config";
  m.layers = g.layers;
  m.hidden = g.hidden;
  m.heads = g.heads;
  m.seq = g.max_seq;
  m.vocab = g.vocab;
  return m;
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

// (group, tile): what one fetch moves and one gradient offload drains, in partition order.
struct Unit {
  std::string name;       // "block0.fc1[tile 1]", as the schedule names it
  std::size_t group = 0;  // index into groups
  int tile = -1;
  std::size_t elems = 0;
  std::size_t at = 0;     // elements from the start of the partition
};
// Part of a unit inside one optimizer chunk.
struct Piece {
  std::size_t unit = 0, from = 0, count = 0;  // elements into the unit
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
  enum Kind { none, event, io, host } kind = none;
  Event ev = nullptr;
  io::IoHandle handle;
  std::shared_ptr<HostTask> task;
};

struct Live {
  Tier tier = Tier::gpu;
  std::size_t offset = 0;
  char* ptr = nullptr;
};

std::string describe(const Step& s) { return "step " + std::to_string(s.id) + " (" + step_label(s) + ")"; }

}  // namespace

struct Engine::Impl {
  EngineOptions o;
  Schedule sched;
  std::unique_ptr<Backend> be;
  std::unique_ptr<GptOps> gpt;
  Stream h2d = 0, d2h = 0;
  std::vector<ParamGroup> groups;
  std::vector<Unit> units;
  std::map<std::string, std::size_t> unit_by_name;
  std::size_t n = 0;       // parameters in the partition
  std::size_t psz = 2;     // bytes per param16 / grad16 element
  int micro_batches = 1;
  std::vector<ChunkPlan> chunks;
  std::vector<int> step_chunk;  // optimizer-phase steps: their chunk

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
  std::size_t dev_param = 0, dev_grad = 0, dev_optim = 0;  // arena offsets of device-resident states
  std::size_t dev_workspace = 0;
  std::vector<void*> registered;  // host memory registered with the backend

  std::unique_ptr<adam::CpuAdam> adam;
  std::unique_ptr<HostLane> lane;
  long adam_step = 0;
  int iteration = 0;
  std::map<std::string, Live> live;
  std::vector<Event> event_pool;
  std::vector<float> grads_kept;  // partition order
  std::array<double, kLinkClasses> bytes_moved{};

  ~Impl() {
    if (be) be->ops().synchronize(be->ctx());
    if (ioe) (void)ioe->wait_all();
    lane.reset();
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

  // ---- layout ----------------------------------------------------------------------------------
  int tiles_of(const ParamGroup& g) const { return g.linear ? o.config.tiling_factor : 1; }

  void lay_out_units() {
    groups = gpt_param_groups(o.model);
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      const ParamGroup& g = groups[gi];
      const int t = tiles_of(g);
      for (int i = 0; i < t; ++i) {
        Unit u;
        u.name = g.name + (t > 1 ? "[tile " + std::to_string(i) + "]" : "");
        u.group = gi;
        u.tile = t > 1 ? i : -1;
        u.elems = g.elems / std::size_t(t);
        u.at = n;
        n += u.elems;
        unit_by_name[u.name] = units.size();
        units.push_back(u);
      }
    }
  }

  Result<bool> plan_chunks() {
    std::size_t at = 0, ui = 0, in_unit = 0;
    for (const Schedule::Chunk& c : sched.optimizer_chunks) {
      ChunkPlan p;
      p.start = std::size_t(c.start);
      p.count = std::size_t(c.params);
      if (double(p.start) != c.start || double(p.count) != c.params || p.start != at)
        return make_error("internal error: optimizer chunk at " + std::to_string(c.start) + " is not whole parameters");
      std::size_t left = p.count;
      while (left > 0 && ui < units.size()) {
        const std::size_t take = std::min(left, units[ui].elems - in_unit);
        p.pieces.push_back({ui, in_unit, take});
        left -= take;
        in_unit += take;
        if (in_unit == units[ui].elems) ++ui, in_unit = 0;
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
      at += p.count;
      chunks.push_back(std::move(p));
    }
    if (at != n) return make_error("internal error: optimizer chunks cover " + std::to_string(at) + " of " +
                                   std::to_string(n) + " parameters");
    step_chunk.assign(sched.steps.size(), -1);
    int last = -1;
    for (const Step& s : sched.steps) {
      if (s.phase != Phase::optimizer) continue;
      const auto lb = s.op.find("[chunk ");
      if (lb != std::string::npos) last = std::stoi(s.op.substr(lb + 7));
      else if (s.op == "adam") last = 0;
      step_chunk[size_t(s.id)] = last;  // "grads" comes before chunk 0, "params" after its chunk
    }
    return true;
  }

  std::size_t state_bytes(State s) const { return s == State::optim32 ? 12 * n : psz * n; }

  // Where a state resident in memory (device or host) starts; elements of the partition.
  char* state_ptr(State s) {
    const Tier t = tier(s);
    if (t == Tier::gpu) return dev.at(s == State::param16 ? dev_param : s == State::grad16 ? dev_grad : dev_optim);
    if (t == Tier::cpu) return (s == State::param16 ? host_param : s == State::grad16 ? host_grad : host_optim).p;
    return nullptr;
  }
  char* unit_in(State s, const Unit& u) { return state_ptr(s) + u.at * psz; }

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

  // ---- creation ------------------------------------------------------------------------------
  Result<bool> check_fit() {
    const std::string hint = "; run `memwall plan` for a placement, batch, checkpoint interval and tiling that fit";
    if (sched.overflow) return make_error("does not fit: " + sched.overflow->message + hint);
    double transient = sched.peak_bytes[int(Tier::cpu)];
    for (double b : sched.persistent_bytes[int(Tier::cpu)]) transient -= b;
    const double pinned = o.profile.pinned_budget_bytes / o.profile.gpus_per_node;
    if (transient > pinned + 0.5)
      return make_error("pinned budget too small: the schedule's CPU buffers need " + format_bytes(transient) + " (" +
                        std::to_string(std::llround(transient)) + " bytes) at once, the profile " + o.profile.name +
                        " gives " + format_bytes(pinned) + " per GPU (cpu.pinned_budget)");
    pin_budget = std::size_t(std::llround(std::max(0.0, transient)));
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
    std::vector<std::uint64_t> unit_bytes, chunk_bytes;
    for (const Unit& u : units) unit_bytes.push_back(u.elems * psz);
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
        Result<io::SwapFile> f = io::SwapFile::create(*ioe, o.nvme_dir, 0, state, shards);
        if (!f) return make_error("--nvme-dir: " + f.error());
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
    Result<std::unique_ptr<Backend>> b = create_backend(o.backend, bo);
    if (!b) return make_error("backend: " + b.error());
    be = std::move(b).value();
    dev_budget = std::size_t(std::ceil(sched.peak_bytes[int(Tier::gpu)]));
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

  // Initial states: master parameters from the seed, moments zero, the 16-bit copy rounded from
  // the master, each written to its tier.
  Result<bool> initialise() {
    const std::vector<float> flat = gpt_init_params(o.model, o.seed);
    std::vector<float> master(n);
    for (const ParamGroup& g : groups) {
      std::vector<float> tiled(g.elems);
      to_tile_major(g, tiles_of(g), flat.data() + g.offset, tiled.data());
      const Unit& u0 = units[unit_by_name.at(g.name + (tiles_of(g) > 1 ? "[tile 0]" : ""))];
      std::copy(tiled.begin(), tiled.end(), master.begin() + long(u0.at));
    }
    std::vector<char> p16(n * psz);
    if (Result<bool> r = round_params(master.data(), p16.data(), n); !r) return r;
    // optimizer states
    std::vector<float> zeros(n, 0.0f);
    if (tier(State::optim32) == Tier::nvme) {
      for (std::size_t c = 0; c < chunks.size(); ++c) {
        const ChunkPlan& ch = chunks[c];
        AlignedBuffer buf(12 * ch.count);
        std::memcpy(buf.p, master.data() + ch.start, ch.count * 4);
        if (Result<bool> r = write_wait(swap_optim->write(c, buf.p)); !r) return r;
      }
    } else {
      upload(State::optim32, 0, master.data(), n * 4);
      upload(State::optim32, n * 4, zeros.data(), n * 4);
      upload(State::optim32, 2 * n * 4, zeros.data(), n * 4);
    }
    // 16-bit parameters
    if (tier(State::param16) == Tier::nvme) {
      for (std::size_t i = 0; i < units.size(); ++i) {
        AlignedBuffer buf(units[i].elems * psz);
        std::memcpy(buf.p, p16.data() + units[i].at * psz, units[i].elems * psz);
        if (Result<bool> r = write_wait(swap_param->write(i, buf.p)); !r) return r;
      }
    } else {
      upload(State::param16, 0, p16.data(), n * psz);
    }
    if (tier(State::grad16) != Tier::nvme) {
      std::vector<char> z(n * psz, 0);
      upload(State::grad16, 0, z.data(), n * psz);
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
  // Bytes a buffer takes in its arena: chunk buffers have their aligned layout; anything the io
  // engine reads or writes is whole 4096-byte blocks.
  std::size_t layout_bytes(const Step& s, const Buffer& b) const {
    if (b.name.rfind("adam[", 0) == 0) return chunks[size_t(step_chunk[size_t(s.id)])].bytes;
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

  Result<Token> issue(const Step& s) {
    switch (s.kind) {
      case StepKind::fetch: return s.phase == Phase::optimizer ? fetch_optimizer(s) : fetch_param(s);
      case StepKind::compute: return compute(s);
      case StepKind::release: return Token{};
      case StepKind::offload: return offload(s);
      case StepKind::save_ckpt: return save_ckpt(s);
      case StepKind::load_ckpt: return load_ckpt(s);
      case StepKind::optimizer: return optimizer(s);
      case StepKind::reduce_scatter:
      case StepKind::allreduce: break;
    }
    return make_error(describe(s) + ": collectives need data-parallel ranks");
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
    if (s.hop == "cg") {
      const char* src = nullptr;
      if (s.src_buf.empty()) {
        src = unit_in(State::param16, **u);
      } else {
        Result<char*> b = buffer(s.src_buf);
        if (!b) return make_error(b.error());
        src = *b;
      }
      k().copy_h2d_async(cx(), h2d, *dst, src, (*u)->elems * psz);
      return on_stream(h2d);
    }
    return make_error(describe(s) + ": collectives need data-parallel ranks");
  }

  Result<Token> fetch_optimizer(const Step& s) {
    const ChunkPlan& ch = chunks[size_t(step_chunk[size_t(s.id)])];
    if (s.op == "params" && s.hop == "cg") {  // updated 16-bit parameters back to the GPU
      Result<char*> src = buffer(s.src_buf);
      if (!src) return make_error(src.error());
      k().copy_h2d_async(cx(), h2d, state_ptr(State::param16) + ch.start * psz, *src, ch.count * psz);
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
      char* w = nullptr;
      if (s.src_buf.empty()) {
        w = unit_in(State::param16, **u);
      } else {
        Result<char*> b = buffer(s.src_buf);
        if (!b) return make_error(b.error());
        w = *b;
      }
      if (mixed) {
        k().to_fp32(cx(), gpt->weight_staging(), w, o.precision, long(elems));
        c.params = gpt->weight_staging();
      } else {
        c.params = reinterpret_cast<const float*>(w);
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
      if (s.op == "grads") {  // every gradient of the rank to CPU memory, for CPU Adam
        Result<char*> dst = buffer(s.dst_buf);
        if (!dst) return make_error(dst.error());
        k().copy_d2h_async(cx(), d2h, *dst, state_ptr(State::grad16), n * psz);
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
      k().copy_d2h_async(cx(), d2h, dst, *src, (*u)->elems * psz);
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
    if (s.dst == Tier::gpu) {
      k().copy_d2d_async(cx(), d2h, *dst, src, bytes);
    } else {
      k().copy_d2h_async(cx(), d2h, *dst, src, bytes);
    }
    // the copy reads what the compute stream wrote: it waits for it
    Event ready = take_event();
    k().event_record(cx(), ready, 0);
    k().stream_wait_event(cx(), d2h, ready);
    event_pool.push_back(ready);
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
      Result<char*> b = buffer("params16");
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
    Token t;
    t.kind = Token::host;
    t.task = lane->post([this, &ch, buf, staged_params, staged_grads, step]() -> std::string {
      return update_chunk(ch, buf, staged_params, staged_grads, step);
    });
    return t;
  }

  // CPU Adam over one chunk, piece by piece (a piece's gradient and 16-bit copy may sit in their own
  // aligned slots of the chunk buffer). Runs on the host lane.
  std::string update_chunk(const ChunkPlan& ch, char* buf, char* staged_params, char* staged_grads, long step) {
    const Tier ot = tier(State::optim32), gt = tier(State::grad16), pt = tier(State::param16);
    float* master = ot == Tier::nvme ? reinterpret_cast<float*>(buf)
                                     : reinterpret_cast<float*>(host_optim.p) + ch.start;
    float* m = ot == Tier::nvme ? master + ch.count : reinterpret_cast<float*>(host_optim.p) + n + ch.start;
    float* v = ot == Tier::nvme ? master + 2 * ch.count : reinterpret_cast<float*>(host_optim.p) + 2 * n + ch.start;
    std::size_t done = 0;
    for (std::size_t i = 0; i < ch.pieces.size(); ++i) {
      const Piece& pc = ch.pieces[i];
      const char* g = gt == Tier::nvme  ? buf + ch.grad_at[i]
                      : gt == Tier::cpu ? host_grad.p + (ch.start + done) * psz
                                        : staged_grads + (ch.start + done) * psz;
      char* p16 = pt == Tier::nvme  ? buf + ch.param_at[i]
                  : pt == Tier::cpu ? host_param.p + (ch.start + done) * psz
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

  Result<Token> optimizer_on_device() {
    if (!k().adam_update) return make_error("the " + be->caps().name + " backend has no device Adam");
    float* master = reinterpret_cast<float*>(state_ptr(State::optim32));
    if (o.keep_gradients) {
      std::vector<char> g(n * psz);
      k().copy_d2h_async(cx(), 0, g.data(), state_ptr(State::grad16), n * psz);
      k().synchronize(cx());
      keep_gradients(g.data(), 0, n);
    }
    DeviceAdam a;
    a.param = master;
    a.exp_avg = master + n;
    a.exp_avg_sq = master + 2 * n;
    a.grad = state_ptr(State::grad16);
    a.grad_type = o.precision;
    a.param16 = o.precision == adam::DType::fp32 ? nullptr : state_ptr(State::param16);
    a.param16_type = o.precision;
    a.n = n;
    a.step = adam_step;
    a.lr = o.lr;
    a.beta1 = o.beta1;
    a.beta2 = o.beta2;
    a.eps = o.eps;
    a.weight_decay = o.weight_decay;
    a.decoupled_weight_decay = true;
    k().adam_update(cx(), a);
    if (o.precision == adam::DType::fp32) k().copy_d2d_async(cx(), 0, state_ptr(State::param16), master, n * 4);
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
    std::size_t cursor = 0, finished = 0;
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
  const int dp = o.config.dp > 0 ? o.config.dp : o.profile.total_gpus();
  if (dp != 1)
    return make_error("--dp: the executor runs one data-parallel rank (dp 1) so far; the profile " + o.profile.name +
                      " has " + std::to_string(o.profile.total_gpus()) + " GPUs (give --dp 1, or a one-GPU profile)");
  o.config.dp = 1;
  if (o.config.bsz != std::floor(o.config.bsz) || o.config.bsz < 1)
    return make_error("--bsz: the executor needs a whole micro-batch >= 1, got " + format_g(o.config.bsz));
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
  Result<Schedule> s = build_schedule(model_spec(o.model), o.placement, o.config, o.profile, 0, sizes);
  if (!s) return make_error(s.error());
  e.sched = std::move(s).value();
  if (std::vector<std::string> bad = check_invariants(e.sched); !bad.empty())
    return make_error("internal error: the schedule breaks an invariant: " + bad.front());
  if (Result<bool> r = e.check_fit(); !r) return make_error(r.error());
  e.lay_out_units();
  if (Result<bool> r = e.plan_chunks(); !r) return make_error(r.error());

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
  if (Result<bool> r = e.initialise(); !r) return make_error(r.error());
  if (o.keep_gradients) e.grads_kept.assign(e.n, 0.0f);
  return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

const Schedule& Engine::schedule() const { return impl_->sched; }
const BackendCaps& Engine::backend_caps() const { return impl_->be->caps(); }
std::size_t Engine::num_params() const { return impl_->n; }
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
  if (e.tier(State::grad16) == Tier::gpu) e.k().memset_zero(e.cx(), e.state_ptr(State::grad16), e.n * e.psz);
  e.k().synchronize(e.cx());
  ++e.adam_step;
  IterationReport r;
  r.iteration = ++e.iteration;
  Result<bool> ok = e.run(r.times, r.peak_bytes);
  if (!ok) {
    --e.adam_step;
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
  r.loss = float(sum / double(per_mb * std::size_t(e.micro_batches)));
  r.iteration_s = std::chrono::duration<double>(Clock::now() - t0).count();
  r.bytes_moved = e.bytes_moved;
  r.overlap = overlap_report(e.sched, r.times);
  if (!e.o.trace) r.times.clear();
  return r;
}

Result<std::vector<float>> Engine::master_params() {
  Impl& e = *impl_;
  std::vector<float> part(e.n);
  if (e.tier(State::optim32) == Tier::nvme) {
    for (std::size_t c = 0; c < e.chunks.size(); ++c) {
      AlignedBuffer buf(12 * e.chunks[c].count);
      if (Result<bool> r = e.write_wait(e.swap_optim->read(c, buf.p)); !r) return make_error(r.error());
      std::memcpy(part.data() + e.chunks[c].start, buf.p, e.chunks[c].count * 4);
    }
  } else if (e.tier(State::optim32) == Tier::gpu) {
    e.k().copy_d2h_async(e.cx(), 0, part.data(), e.state_ptr(State::optim32), e.n * 4);
    e.k().synchronize(e.cx());
  } else {
    std::memcpy(part.data(), e.host_optim.p, e.n * 4);
  }
  std::vector<float> flat(part.size());
  for (const ParamGroup& g : e.groups) {
    const Unit& u0 = e.units[e.unit_by_name.at(g.name + (e.tiles_of(g) > 1 ? "[tile 0]" : ""))];
    from_tile_major(g, e.tiles_of(g), part.data() + u0.at, flat.data() + g.offset);
  }
  return flat;
}

std::vector<float> Engine::gradients() const {
  const Impl& e = *impl_;
  if (e.grads_kept.empty()) return {};
  std::vector<float> flat(e.n);
  for (const ParamGroup& g : e.groups) {
    const Unit& u0 = e.units[e.unit_by_name.at(g.name + (e.tiles_of(g) > 1 ? "[tile 0]" : ""))];
    from_tile_major(g, e.tiles_of(g), e.grads_kept.data() + u0.at, flat.data() + g.offset);
  }
  return flat;
}

Result<std::vector<float>> Engine::logits() {
  Impl& e = *impl_;
  const std::size_t count = std::size_t(e.o.config.bsz) * std::size_t(e.o.model.max_seq) * std::size_t(e.o.model.vocab);
  std::vector<float> out(count);
  e.k().copy_d2h_async(e.cx(), 0, out.data(), e.gpt->logits(0), count * sizeof(float));
  e.k().synchronize(e.cx());
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
