#include "exec/engine/calibrate.hpp"

#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>

#include "exec/adam/adam_bench.hpp"
#include "exec/adam/cpu_adam.hpp"
#include "exec/backend/backend.hpp"
#include "exec/engine/collectives.hpp"
#include "exec/engine/engine.hpp"
#include "exec/gpt/gpt.hpp"
#include "exec/io/io_bench.hpp"
#include "model/operator_graph.hpp"
#include "model/units.hpp"
#include "model/yaml_reader.hpp"

namespace memwall::exec {
namespace {

using Clock = std::chrono::steady_clock;
std::string threads_text(int n) { return std::to_string(n) + (n == 1 ? " host thread" : " host threads"); }
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The best wall time of `fn` (which ends with the backend synchronized): at least 3 runs, more
// until about 60 ms were spent, at most 50; one untimed run first. The best, not the median:
// another process can only add time to a run, so the fastest is the one it disturbed least.
template <typename F>
double time_it(F&& fn, std::size_t fixed_runs = 0) {
  fn();
  std::vector<double> t;
  double total = 0;
  // fixed_runs > 0: that many, whatever the times (a collective: every rank must call it as often as
  // the others, and a count that followed each rank's own clock let them disagree on a loaded machine)
  while (fixed_runs > 0 ? t.size() < fixed_runs : t.size() < 3 || (total < 0.06 && t.size() < 50)) {
    const auto t0 = Clock::now();
    fn();
    t.push_back(since(t0));
    total += t.back();
  }
  return *std::min_element(t.begin(), t.end());
}

struct OpTime {
  std::string name;  // the operator graph's name ("block0.fc1")
  double fwd_s = 0, bwd_s = 0;
};

// Device buffers freed on every path.
struct DeviceBuffers {
  Backend& b;
  std::vector<void*> held;
  explicit DeviceBuffers(Backend& be) : b(be) {}
  ~DeviceBuffers() {
    for (void* p : held) b.ops().free(b.ctx(), p);
  }
  // 256-byte aligned (what GptOps and the engine's arena use), zeroed
  Result<char*> get(std::size_t bytes) {
    Result<void*> p = b.ops().alloc(b.ctx(), bytes + 256);
    if (!p) return make_error(p.error());
    held.push_back(*p);
    const auto at = (reinterpret_cast<std::uintptr_t>(*p) + 255) / 256 * 256;
    char* aligned = reinterpret_cast<char*>(at);
    b.ops().memset_zero(b.ctx(), aligned, bytes);
    return aligned;
  }
};

// One block's operators with their parameters on the device, each run as a compute step of the
// engine runs it: the 16-bit weights widened to fp32 first, the fp32 gradient rounded into its
// 16-bit buffer after (exec/engine/handlers.cpp, compute).
struct BlockRig {
  const BackendOps* k = nullptr;
  void* cx = nullptr;
  GptOps* gpt = nullptr;
  adam::DType precision = adam::DType::bf16;
  std::size_t psz = 2;
  char *p32 = nullptr, *p16 = nullptr, *g32 = nullptr, *g16 = nullptr;
  std::vector<OpCall> calls;
  std::vector<std::string> names;
  std::vector<std::size_t> elems, offsets;  // each operator's parameter group

  bool mixed() const { return precision != adam::DType::fp32; }
  void forward(std::size_t i) {
    OpCall c = calls[i];
    if (elems[i] > 0) c.params = weights(i);
    gpt->forward(c);
  }
  void backward(std::size_t i) {
    OpCall c = calls[i];
    if (elems[i] > 0) {
      c.params = weights(i);
      if (mixed()) k->memset_zero(cx, gpt->grad_staging(), elems[i] * 4);
      c.grads = mixed() ? gpt->grad_staging() : reinterpret_cast<float*>(g32) + offsets[i];
    }
    gpt->backward(c);
    if (elems[i] > 0 && mixed()) k->accumulate_to(cx, g16 + offsets[i] * psz, gpt->grad_staging(), precision, long(elems[i]));
  }

 private:
  const float* weights(std::size_t i) {
    if (!mixed()) return reinterpret_cast<const float*>(p32) + offsets[i];
    k->to_fp32(cx, gpt->weight_staging(), p16 + offsets[i] * psz, precision, long(elems[i]));
    return gpt->weight_staging();
  }
};

// The rig's parameters (initialised, rounded to 16 bits), inputs and operator calls.
Result<bool> set_up(BlockRig& r, DeviceBuffers& mem, const GptConfig& cfg, int B, int T, int tiles) {
  const std::vector<float> init = gpt_init_params(cfg, 1);
  const std::size_t n = init.size();
  Result<char*> p32 = mem.get(n * 4), p16 = mem.get(n * r.psz), g32 = mem.get(n * 4), g16 = mem.get(n * r.psz);
  if (!p32 || !p16 || !g32 || !g16)
    return make_error("device memory for the parameters: " +
                      (!p32 ? p32.error() : !p16 ? p16.error() : !g32 ? g32.error() : g16.error()));
  r.p32 = *p32, r.p16 = *p16, r.g32 = *g32, r.g16 = *g16;
  r.k->copy_h2d_async(r.cx, 0, r.p32, init.data(), n * 4);
  r.k->from_fp32(r.cx, r.p16, reinterpret_cast<const float*>(r.p32), r.precision, long(n));
  std::vector<int> tok(std::size_t(B) * T);
  for (std::size_t i = 0; i < tok.size(); ++i) tok[i] = int((i * 131 + 7) % std::size_t(cfg.vocab));
  r.k->copy_h2d_async(r.cx, 0, r.gpt->tokens(0), tok.data(), tok.size() * sizeof(int));
  r.k->copy_h2d_async(r.cx, 0, r.gpt->targets(0), tok.data(), tok.size() * sizeof(int));
  r.k->synchronize(r.cx);
  const std::vector<ParamGroup> groups = gpt_param_groups(cfg);
  const OperatorGraph graph = build_gpt_graph(gpt_model_spec(cfg), B, T);
  for (size_t v : graph.order) {
    const Operator& gop = graph.op(v);
    OpCall c;
    c.op = OpRef{gop.role, gop.block};
    const int gi = param_group_of(cfg, gop.role, gop.block);
    // a tiled linear layer runs as the engine runs it: one call per tile, each with its tile's
    // share of the group's parameters (the tile's weights' values do not change its time)
    const int n = gop.kind == memwall::OpKind::linear && tiles > 1 ? tiles : 1;
    for (int t = 0; t < n; ++t) {
      c.tile = n > 1 ? t : -1;
      c.tiles = n;
      r.calls.push_back(c);
      r.names.push_back(gop.name);
      r.elems.push_back(gi >= 0 ? groups[size_t(gi)].elems / std::size_t(n) : 0);
      r.offsets.push_back(gi >= 0 ? groups[size_t(gi)].offset : 0);
    }
  }
  return true;
}

// One iteration of the block as training runs a checkpointed one: forward, then in backward the
// block recomputed from its saved input, then its backward; `each` wraps every call.
template <typename Each>
void iteration(BlockRig& r, Each&& each, std::vector<std::vector<double>>& fwd, std::vector<std::vector<double>>& bwd) {
  for (std::size_t i = 0; i < r.calls.size(); ++i) {
    r.calls[i].recompute = false;
    each(fwd[i], [&] { r.forward(i); });
  }
  for (std::size_t i = 0; i < r.calls.size(); ++i) {
    r.calls[i].recompute = r.calls[i].op.block >= 0;
    if (r.calls[i].recompute) each(fwd[i], [&] { r.forward(i); });
  }
  for (std::size_t i = r.calls.size(); i-- > 0;) each(bwd[i], [&] { r.backward(i); });
}

// Every operator of a one-block GPT at (B, T), forward and backward, timed where it runs in
// training: inside whole iterations of the block (forward, the checkpointed block recomputed,
// backward), every call synchronised, so it meets the caches and the thread pools (OpenBLAS's,
// OpenMP's) the operator before it left behind, not a loop of itself. The median over the
// iterations, forward calls and recomputes together: not the best (time_it's choice for the
// transfers), because what disturbs an operator here (the other ranks' operators on the cores they
// share, the machine's own jitter) disturbs it in training too, and the simulator predicts the
// median iteration `memwall validate` measures. The best of each operator alone, summed, was an
// iteration no run reaches: on a 2-core VM whose operators vary by 10-20 % from run to run, it made
// validate's dp 2 rows 35 % too fast (results/validation/drifting-host/). `jitter` becomes at least the spread of
// the timed iterations' totals (10th to 90th percentile, over the median: one preempted iteration
// among many does not count): how far apart the same work ran.
Result<std::vector<OpTime>> time_block(Backend& b, const CalibrateOptions& o, const GptConfig& cfg, double& jitter,
                                       int tiles = 1) {
  const int B = o.bsz, T = o.seq;
  DeviceBuffers mem(b);
  const std::size_t ws_bytes = GptOps::workspace_bytes(cfg, B, T, 1, 1, tiles);
  Result<char*> ws = mem.get(ws_bytes);
  if (!ws) return make_error(ws.error());
  Result<std::unique_ptr<GptOps>> made = GptOps::create(b, cfg, B, T, 1, 1, tiles, *ws, ws_bytes);
  if (!made) return make_error(made.error());
  BlockRig r;
  r.k = &b.ops();
  r.cx = b.ctx();
  r.gpt = made->get();
  r.precision = o.precision;
  r.psz = adam::dtype_bytes(o.precision);
  if (Result<bool> ok = set_up(r, mem, cfg, B, T, tiles); !ok) return make_error(ok.error());
  std::vector<std::vector<double>> fwd(r.calls.size()), bwd(r.calls.size());
  // one untimed iteration first: from then on every buffer holds what it would in training
  r.gpt->set_segment_input(0, r.gpt->block_input(0, 0));
  iteration(r, [](std::vector<double>&, auto&& fn) { fn(); }, fwd, bwd);
  r.k->synchronize(r.cx);
  std::vector<double> totals;  // each timed iteration's
  auto timed = [&](std::vector<double>& into, auto&& fn) {
    const auto t0 = Clock::now();
    fn();
    r.k->synchronize(r.cx);
    into.push_back(since(t0));
    totals.back() += into.back();
  };
  const auto started = Clock::now();
  const int at_least = std::max(3, o.block_iterations);
  for (int it = 0; it < at_least || (since(started) < 0.4 && it < 50); ++it) {
    totals.push_back(0);
    iteration(r, timed, fwd, bwd);
  }
  jitter = std::max(jitter, (quantile(totals, 0.9) - quantile(totals, 0.1)) / median(totals));
  std::vector<OpTime> out;
  for (std::size_t i = 0; i < r.calls.size(); ++i) out.push_back({r.names[i], median(fwd[i]), median(bwd[i])});
  if (r.k->sticky_error)
    if (const char* e = r.k->sticky_error(r.cx)) return make_error(std::string("the backend failed: ") + e);
  return out;
}

struct KindTotals {
  double flops = 0, bytes = 0, seconds = 0;
};

// Per operator kind of the graph: FLOPs and activation bytes of forward + backward (backward moves
// twice the forward's bytes, as the simulator counts), and the measured time of both.
std::map<memwall::OpKind, KindTotals> by_kind(const std::vector<OpTime>& times, const GptConfig& cfg, int B, int T,
                                     double act_bytes) {
  const OperatorGraph graph = build_gpt_graph(gpt_model_spec(cfg), B, T);
  std::map<std::string, const Operator*> ops;
  for (size_t v : graph.order) ops[graph.op(v).name] = &graph.op(v);
  std::map<memwall::OpKind, KindTotals> out;
  for (const OpTime& t : times) {
    const Operator& op = *ops.at(t.name);
    KindTotals& k = out[op.kind];
    k.flops += op.fwd_flops + op.bwd_flops;
    k.bytes += 3 * (op.act_read_bytes + op.act_write_bytes) * act_bytes / kGraphActBytes;
    k.seconds += t.fwd_s + t.bwd_s;
  }
  return out;
}

// gpu.kernels from the totals: every kind but the linear layers (those are gpu.peak_by_hidden).
std::vector<KernelRate> kernel_rates(const std::map<memwall::OpKind, KindTotals>& kinds) {
  std::vector<KernelRate> out;
  for (const auto& [kind, tot] : kinds) {
    if (kind == memwall::OpKind::linear || tot.seconds <= 0) continue;
    KernelRate kr{memwall::to_string(kind), 0, 0};
    if (kernel_kind_is_flop_rated(kr.kind)) kr.flops_per_s = tot.flops / tot.seconds;
    else kr.bytes_per_s = tot.bytes / tot.seconds;
    out.push_back(kr);
  }
  return out;
}

// gpu.gemm: each linear layer's GEMM shape (its tiles' when tiled) and the rate of its forward and
// backward together, its tiles' times summed.
std::vector<GemmPoint> gemm_points(const std::vector<OpTime>& times, const GptConfig& cfg, int B, int T, int tiles) {
  const ModelSpec spec = gpt_model_spec(cfg);
  const OperatorGraph graph = build_gpt_graph(spec, B, T);
  std::map<std::string, double> seconds;
  for (const OpTime& t : times) seconds[t.name] += t.fwd_s + t.bwd_s;
  std::vector<GemmPoint> out;
  for (size_t v : graph.order) {
    const Operator& op = graph.op(v);
    if (op.kind != memwall::OpKind::linear || seconds[op.name] <= 0) continue;
    const GemmShape g = linear_gemm_shape(spec, op.role, long(B) * T, 1, tiles);
    out.push_back({g.m, g.n, g.k, (op.fwd_flops + op.bwd_flops) / seconds[op.name]});
  }
  return out;
}

}  // namespace

const Measurement* Calibration::find(const std::string& field) const {
  for (const Measurement& m : fields)
    if (m.field == field) return &m;
  return nullptr;
}

namespace {

using Say = std::function<void(const std::string&)>;

// GEMM FLOP/s by hidden size: the linear operators of one block; the other kernels at kernel_hidden.
Result<bool> measure_gemm(const CalibrateOptions& o, Backend& b, Calibration& c, const Say& say) {
  const std::string prec(adam::dtype_name(o.precision));
  const double act_bytes = executor_sizes(GptConfig{}, TrainingConfig{}, o.precision, 1).act_bytes;
  for (int h : o.hiddens) {
    say("GEMM: the linear layers of a block at hidden " + std::to_string(h) + " ...");
    const GptConfig cfg{1, h, h / o.head_size, o.seq, 256};
    Result<std::vector<OpTime>> t = time_block(b, o, cfg, c.jitter);
    if (!t) return make_error(t.error());
    const std::map<memwall::OpKind, KindTotals> kinds = by_kind(*t, cfg, o.bsz, o.seq, act_bytes);
    const KindTotals& lin = kinds.at(memwall::OpKind::linear);
    c.peak_by_hidden.push_back({h, lin.flops / lin.seconds});
    if (h == o.kernel_hidden) c.kernels = kernel_rates(kinds);  // the other kinds, at this shape
    const std::vector<GemmPoint> whole = gemm_points(*t, cfg, o.bsz, o.seq, 1);
    c.gemm.insert(c.gemm.end(), whole.begin(), whole.end());
    // the thinner GEMMs of memory-centric tiling (Sec. 5.1.3): the same layers, their outputs split
    for (int tiles : o.gemm_tilings) {
      if (tiles < 2 || h % tiles != 0) continue;
      say("GEMM: the linear layers of a block at hidden " + std::to_string(h) + ", tiling " + std::to_string(tiles) + " ...");
      Result<std::vector<OpTime>> tt = time_block(b, o, cfg, c.jitter, tiles);
      if (!tt) return make_error(tt.error());
      const std::vector<GemmPoint> tiled = gemm_points(*tt, cfg, o.bsz, o.seq, tiles);
      c.gemm.insert(c.gemm.end(), tiled.begin(), tiled.end());
    }
  }
  if (std::find(o.hiddens.begin(), o.hiddens.end(), o.kernel_hidden) == o.hiddens.end()) {
    say("kernels at hidden " + std::to_string(o.kernel_hidden) + " ...");
    const GptConfig cfg{1, o.kernel_hidden, o.kernel_hidden / o.head_size, o.seq, 256};
    Result<std::vector<OpTime>> t = time_block(b, o, cfg, c.jitter);
    if (!t) return make_error(t.error());
    c.kernels = kernel_rates(by_kind(*t, cfg, o.bsz, o.seq, act_bytes));
  }
  double peak = 0;
  for (const PeakPoint& p : c.peak_by_hidden) peak = std::max(peak, p.flops_per_s);
  c.fields.push_back({"gpu.peak", peak,
                      "measured: the best of gpu.peak_by_hidden (fp32 GEMMs of qkv, proj, fc1, fc2, forward and "
                      "backward, " + prec + " weights widened as the engine does; B " + std::to_string(o.bsz) +
                          ", T " + std::to_string(o.seq) + ")"});

  return true;
}

// gpu.shared_peak: the linear layers of a block at the largest hidden size timed by every rank at
// once (after a barrier), their rates summed: the node's rate when all its ranks compute.
Result<bool> measure_shared_peak(const CalibrateOptions& o, Backend& b, Collectives& mpi, Calibration& c,
                                 const Say& say) {
  const int h = *std::max_element(o.hiddens.begin(), o.hiddens.end());
  say("GEMM: the linear layers of a block at hidden " + std::to_string(h) + ", every rank at once ...");
  const double act_bytes = executor_sizes(GptConfig{}, TrainingConfig{}, o.precision, 1).act_bytes;
  const GptConfig cfg{1, h, h / o.head_size, o.seq, 256};
  Result<std::vector<OpTime>> t = time_block(b, o, cfg, c.jitter);
  if (!t) return make_error(t.error());
  const std::map<memwall::OpKind, KindTotals> kinds = by_kind(*t, cfg, o.bsz, o.seq, act_bytes);
  const KindTotals& lin = kinds.at(memwall::OpKind::linear);
  Result<double> sum = mpi.all_reduce_sum(lin.flops / lin.seconds);
  if (!sum) return make_error(sum.error());
  c.fields.push_back({"gpu.shared_peak", *sum,
                      "measured: the linear layers of a block at hidden " + std::to_string(h) + " on all " +
                          std::to_string(mpi.size()) + " ranks at once, their rates summed (gpu.peak: one rank alone)"});
  return true;
}

// Memory-bound kernel bandwidth: the residual add (2 reads, 1 write) over 3 x 64 MiB.
Result<bool> measure_memory_bandwidth(const CalibrateOptions&, Backend& b, Calibration& c, const Say& say) {
  const auto& k = b.ops();
  void* cx = b.ctx();
  {
    say("device memory bandwidth (residual kernel) ...");
    const long n = 16L << 20;
    DeviceBuffers mem(b);
    Result<char*> x = mem.get(std::size_t(n) * 4), y = mem.get(std::size_t(n) * 4), z = mem.get(std::size_t(n) * 4);
    if (!x || !y || !z) {
      c.fields.push_back({"gpu.memory_bandwidth", 0, "not measured: 192 MiB of device memory not available"});
    } else {
      const double s = time_it([&] {
        k.residual_forward(cx, reinterpret_cast<float*>(*z), reinterpret_cast<const float*>(*x),
                           reinterpret_cast<const float*>(*y), n);
        k.synchronize(cx);
      });
      c.fields.push_back({"gpu.memory_bandwidth", 12.0 * double(n) / s,
                          "measured: the backend's residual kernel, 2 reads + 1 write of 16M fp32"});
    }
  }

  return true;
}

// Host <-> device copies, from page-locked host memory, 1 MiB pieces, one and two streams.
Result<bool> measure_copies(const CalibrateOptions& o, Backend& b, Calibration& c, const Say& say) {
  const auto& k = b.ops();
  void* cx = b.ctx();
  {
    say("host <-> device copies ...");
    const std::size_t bytes = std::size_t(64) << 20, piece = std::size_t(1) << 20;
    DeviceBuffers mem(b);
    Result<char*> dev = mem.get(bytes);
    void* host = nullptr;
    if (posix_memalign(&host, 4096, bytes) != 0) host = nullptr;
    std::unique_ptr<void, void (*)(void*)> host_owner(host, std::free);
    bool registered = false;
    if (host && k.host_register) {
      Result<bool> r = k.host_register(cx, host, bytes);
      registered = r && *r;
    }
    Result<Stream> s1 = k.stream_create(cx), s2 = k.stream_create(cx);
    if (!dev || !host || !s1 || !s2) {
      const std::string why = !dev ? dev.error() : !host ? "no host memory" : !s1 ? s1.error() : s2.error();
      c.fields.push_back({"links.pcie_single_gpu", 0, "not measured: " + why});
      c.fields.push_back({"links.pcie_aggregate", 0, "not measured: " + why});
    } else {
      std::memset(host, 1, bytes);
      auto run = [&](bool h2d, int streams) {
        return time_it([&] {
          for (std::size_t off = 0; off < bytes; off += piece) {
            const Stream s = streams == 1 || (off / piece) % 2 == 0 ? *s1 : *s2;
            if (h2d) k.copy_h2d_async(cx, s, *dev + off, static_cast<char*>(host) + off, piece);
            else k.copy_d2h_async(cx, s, static_cast<char*>(host) + off, *dev + off, piece);
          }
          k.synchronize(cx);
        });
      };
      const double h1 = double(bytes) / run(true, 1), d1 = double(bytes) / run(false, 1);
      const double h2 = double(bytes) / run(true, 2), d2 = double(bytes) / run(false, 2);
      const std::string pin = registered ? "page-locked" : o.backend == "cpu" ? "host (the device is host memory)"
                                                                              : "pageable (host_register failed)";
      std::ostringstream one, two;
      one << "measured: one copy stream, 64 MiB in 1 MiB copies from " << pin << " memory: to device "
          << format_bandwidth(h1) << ", to host " << format_bandwidth(d1) << " (the mean)";
      two << "measured: two copy streams at once: to device " << format_bandwidth(h2) << ", to host "
          << format_bandwidth(d2) << " (the mean; at least pcie_single_gpu)";
      const double single = 0.5 * (h1 + d1);
      c.fields.push_back({"links.pcie_single_gpu", single, one.str()});
      c.fields.push_back({"links.pcie_aggregate", std::max(single, 0.5 * (h2 + d2)), two.str()});
    }
    if (registered) k.host_unregister(cx, host);
  }

  return true;
}

// gpu.memory and gpu.reserve on cuda (issue 28 item 4): the device's memory less the margin memwall
// run leaves free for NCCL and the driver; the context as what was in use once memwall's context
// and cuBLAS handle were made (other processes' memory included: calibrate an idle GPU); the
// cuBLAS workspace memwall gives. Their difference is exactly what memwall run's memory plan may
// fill. The communicator part is measured by measure_collectives where there are ranks.
void measure_reserve(const BackendCaps& caps, Calibration& c) {
  const double total = double(caps.device_total_bytes), margin = double(caps.kept_free_bytes);
  c.fields.push_back({"gpu.memory", total - margin,
                      "measured: the device's " + format_bytes(total) + " (cudaMemGetInfo) less the " +
                          format_bytes(margin) + " memwall run leaves free for NCCL and the driver"});
  c.fields.push_back({"gpu.reserve.context", total - double(caps.device_free_bytes),
                      "measured: in use once the CUDA context and cuBLAS were made (cudaMemGetInfo)"});
  c.fields.push_back({"gpu.reserve.workspace", double(caps.reserved_bytes), "chosen: memwall's cuBLAS workspace"});
}

// An all-reduce between the job's ranks (mpirun): links.gpu_gpu. Through what memwall run uses
// between those devices: MPI on the cpu backend, NCCL on cuda (device memory never goes to MPI:
// Debian's OpenMPI is not CUDA-aware).
Result<bool> measure_collectives(const CalibrateOptions&, Backend& b, Calibration& c, const Say& say) {
  MpiWorld& world = MpiWorld::get();
  if (world.size() > 1) {
    // the buffer first: what the device loses between the communicator's making and the end of the
    // all-reduce is then NCCL's alone (gpu.reserve.communicator)
    const std::size_t count = std::size_t(4) << 20;  // 16 MiB of fp32
    DeviceBuffers mem(b);
    Result<char*> buf = mem.get(count * 4);
    if (!buf) return make_error(buf.error());
    Result<std::unique_ptr<Collectives>> mpi = make_mpi_collectives();
    if (!mpi) return make_error(mpi.error());
    Result<std::unique_ptr<Collectives>> coll = b.caps().name == "cuda"
                                                    ? make_nccl_collectives(b, **mpi)
                                                    : Result<std::unique_ptr<Collectives>>(std::move(mpi).value());
    if (!coll) return make_error(coll.error());
    const std::string via = (*coll)->name() == "nccl" ? "NCCL" : "MPI";
    say(via + " all-reduce between " + std::to_string(world.size()) + " ranks ...");
    std::string failed;
    const double s = time_it([&] {
      if (!failed.empty()) return;
      Result<std::unique_ptr<CollectiveOp>> op = (*coll)->all_reduce(*buf, count, adam::DType::fp32);
      if (!op) { failed = op.error(); return; }
      for (;;) {
        Result<bool> done = (*op)->test();
        if (!done) { failed = done.error(); return; }
        if (*done) break;
      }
    }, 5);
    if (!failed.empty()) return make_error("all-reduce: " + failed);
    if (b.caps().name == "cuda")
      c.fields.push_back({"gpu.reserve.communicator", double((*coll)->device_bytes()),
                          "measured: device memory NCCL took for a communicator of " + std::to_string(world.size()) +
                              " ranks and its first all-reduces (cudaMemGetInfo)"});
    const double n = world.size();
    c.fields.push_back({"links.gpu_gpu", 4.0 * double(count) * 2 * (n - 1) / n / s,
                        "measured: " + via + " all-reduce of 16 MiB fp32 between " + std::to_string(world.size()) +
                            " ranks, bus bandwidth (2(n-1)/n x bytes / time)"});
  } else {
    c.fields.push_back({"links.gpu_gpu", 0, "not measured: one process (run under mpirun -np 2 to measure it)"});
    if (b.caps().name == "cuda")
      c.fields.push_back({"gpu.reserve.communicator", 0, "not measured: one process (run under mpirun -np 2)"});
  }

  return true;
}

// CPU Adam and the DRAM triad (memwall adam-bench), physical memory.
Result<bool> measure_cpu(const CalibrateOptions& o, Backend&, Calibration& c, const Say& say) {
  const std::string prec(adam::dtype_name(o.precision));
  {
    say("CPU Adam and DRAM triad (" + format_count(double(o.adam_params)) + " params) ...");
    adam::AdamBenchOptions ao;
    ao.params = o.adam_params;
    ao.param16_dtype = o.precision == adam::DType::fp32 ? adam::DType::bf16 : o.precision;
    ao.grad_dtype = o.precision;
    ao.repeats = 5;
    ao.threads = c.threads;
    Result<adam::AdamBenchReport> r = adam::run_adam_bench(ao);
    if (!r) return make_error(r.error());
    c.fields.push_back({"cpu.memory", double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGESIZE)),
                        "measured: physical memory (sysconf)"});
    c.fields.push_back({"cpu.memory_bandwidth", r->triad_Bps,
                        "measured: STREAM triad over " + format_count(double(o.adam_params)) + " fp32, " +
                            std::to_string(r->threads) + " threads"});
    c.fields.push_back({"cpu.adam_throughput", r->params_per_s,
                        "measured: CpuAdam step, " + std::string(adam::isa_name(r->isa)) + ", " +
                            std::to_string(r->threads) + " threads, " + prec + " gradients in (memwall adam-bench)"});
    c.fields.push_back({"cpu.pinned_budget", o.pinned_budget_bytes, "chosen: what memwall run may page-lock"});
  }

  return true;
}

// NVMe through the engine's io engine (io-bench at its block size and queue depth).
Result<bool> measure_nvme(const CalibrateOptions& o, Backend&, Calibration& c, const Say& say) {
  if (o.nvme_dir.empty()) {
    c.fields.push_back({"nvme.capacity", 0, "not measured: no --nvme-dir"});
    c.fields.push_back({"nvme.read", 0, "not measured: no --nvme-dir"});
    c.fields.push_back({"nvme.write", 0, "not measured: no --nvme-dir"});
  } else {
    say("NVMe: io engine on " + o.nvme_dir + " (" + format_bytes(double(o.nvme_bytes)) + ") ...");
    io::IoBenchOptions io;
    io.dir = o.nvme_dir;
    io.size_bytes = o.nvme_bytes;
    const io::EngineOptions engine_defaults;  // what the engine's swap files use
    io.block_bytes = engine_defaults.block_bytes;
    io.queue_depth = engine_defaults.queue_depth;
    // the best of two passes, as every transfer is the best of several runs
    Result<io::IoBenchResult> once = io::run_io_bench(io);
    if (!once) return make_error(once.error());
    Result<io::IoBenchResult> again = io::run_io_bench(io);
    if (!again) return make_error(again.error());
    io::IoBenchResult best = *once;
    best.read_Bps = std::max(once->read_Bps, again->read_Bps);
    best.write_Bps = std::max(once->write_Bps, again->write_Bps);
    const io::IoBenchResult* r = &best;
    struct statvfs sv {};
    const double room = statvfs(o.nvme_dir.c_str(), &sv) == 0 ? double(sv.f_bavail) * double(sv.f_frsize) : 0;
    const std::string how = "measured: io_uring, " + std::string(r->direct ? "O_DIRECT" : "buffered (no O_DIRECT here)") +
                            ", " + format_bytes(double(io.block_bytes)) + " blocks, queue depth " +
                            std::to_string(io.queue_depth) + ", sequential, " + format_bytes(double(io.size_bytes)) +
                            " in " + o.nvme_dir + ", the better of two passes";
    c.fields.push_back({"nvme.capacity", room, "measured: free space in " + o.nvme_dir});
    c.fields.push_back({"nvme.read", r->read_Bps, how});
    c.fields.push_back({"nvme.write", r->write_Bps, how});
  }
  return true;
}

}  // namespace

Result<Calibration> calibrate(const CalibrateOptions& o) {
  const auto t_start = Clock::now();
  const Say say = [&](const std::string& s) {
    if (o.progress) o.progress(s);
  };
  if (o.bsz < 1 || o.seq < 1 || o.head_size < 1) return make_error("bsz, seq and head size must be >= 1");
  for (int h : o.hiddens)
    if (h < o.head_size || h % o.head_size != 0)
      return make_error("--hidden: " + std::to_string(h) + " is not a multiple of the head size " +
                        std::to_string(o.head_size));
  if (o.kernel_hidden < o.head_size || o.kernel_hidden % o.head_size != 0)
    return make_error("--kernel-hidden: " + std::to_string(o.kernel_hidden) + " is not a multiple of the head size " +
                      std::to_string(o.head_size));
  Calibration c;
  c.backend = o.backend;
  c.ranks = MpiWorld::get().size();
  c.precision = o.precision;
  // The load first: a busy machine is refused before anything is measured (by every rank, when
  // any rank's is busy: one rank stopping alone would leave the others waiting in a collective).
  const std::vector<int>& job = MpiWorld::get().node_peer_pids();
  say("looking at the load (0.5 s) ...");
  Result<adam::LoadWindow> first = adam::begin_load_window(job);
  if (!first) return make_error(first.error());
  Result<adam::CpuLoad> before = adam::end_load_window(*first, 0.5);
  if (!before) return make_error(before.error());
  c.load_before = *before;
  double busy = c.load_before.others >= adam::kBusyCores ? 1 : 0;
  if (c.ranks > 1) {
    Result<std::unique_ptr<Collectives>> coll = make_mpi_collectives();
    if (!coll) return make_error(coll.error());
    Result<double> any = (*coll)->all_reduce_sum(busy);
    if (!any) return make_error(any.error());
    busy = *any;
  }
  if (busy > 0 && !o.allow_busy)
    return make_error(c.load_before.others >= adam::kBusyCores
                          ? "this machine is busy: " + adam::describe_load(c.load_before) +
                                "; its figures would be the share they leave, not the machine's (run it when they are "
                                "done, or give --allow-busy to measure that share)"
                          : "another rank's machine is busy (its message says with what)");
  c.threads = adam::fit_threads(c.load_before);
  if (busy > 0)
    c.warnings.push_back("measured on a busy machine (--allow-busy), with " + threads_text(c.threads) + ": " +
                         adam::describe_load(c.load_before));
  Result<adam::LoadWindow> during = adam::begin_load_window(job);
  if (!during) return make_error(during.error());
  BackendOptions bo;
  bo.threads = c.threads;
  if (o.backend == "cuda") bo.device = MpiWorld::get().node_rank();  // one GPU per rank of a node
  Result<std::unique_ptr<Backend>> be = create_backend(o.backend, bo);
  if (!be) return make_error(be.error());
  std::unique_ptr<Backend> owned = std::move(be).value();
  if (o.wrap_backend) owned = o.wrap_backend(std::move(owned));
  Backend& b = *owned;
  c.device = b.caps().device;
  // what the profile calls the GPU's memory
  if (o.backend == "cpu")
    c.fields.push_back({"gpu.memory", o.device_memory_bytes,
                        "chosen, not measured: the cpu backend's device capacity (memwall run's `capacity`)"});
  else
    measure_reserve(b.caps(), c);
  // The cpu backend's devices are this machine's cores and memory, which every rank shares: under
  // mpirun the device's own rates are measured by rank 0 alone while the others wait (sleeping in a
  // barrier), what a rank computes at when the others do not (gpu.peak), and then by every rank at
  // once (gpu.shared_peak, measure_shared_peak): the simulator splits that among the ranks computing
  // together.
  MpiWorld& world = MpiWorld::get();
  const bool one_measures = o.backend == "cpu" && world.size() > 1;
  for (auto* measure : {measure_gemm, measure_memory_bandwidth, measure_copies, measure_collectives, measure_cpu,
                        measure_nvme}) {
    const bool device_rate = measure == measure_gemm || measure == measure_memory_bandwidth;
    if (one_measures && device_rate) {
      if (world.rank() == 0)
        if (Result<bool> r = measure(o, b, c, say); !r) return make_error(r.error());
      Result<std::unique_ptr<Collectives>> mpi = make_mpi_collectives();
      if (!mpi) return make_error(mpi.error());
      if (Result<bool> r = (*mpi)->barrier(); !r) return make_error(r.error());
      if (measure == measure_gemm)
        if (Result<bool> r = measure_shared_peak(o, b, **mpi, c, say); !r) return make_error(r.error());
      continue;
    }
    if (Result<bool> r = measure(o, b, c, say); !r) return make_error(r.error());
  }
  Result<adam::CpuLoad> load = adam::end_load_window(*during, 0);
  if (!load) return make_error(load.error());
  c.load_during = *load;
  if (c.load_during.others >= adam::kBusyCores)
    c.warnings.push_back("while it measured (on average), " + adam::describe_load(c.load_during) +
                         "; its figures may be low");
  if (c.jitter > kJitterWarn)
    c.warnings.push_back("the same block's iterations ran up to " + format_sig(100 * c.jitter, 2) +
                         " % apart while it measured (this machine's speed varies): expect iteration times that far "
                         "from what this profile predicts; calibrate when the machine is quieter");
  c.seconds = since(t_start);
  return c;
}

Dimension calibration_dimension(const std::string& field) {
  if (field == "gpu.peak" || field == "gpu.shared_peak") return Dimension::flops_rate;
  if (field == "cpu.adam_throughput") return Dimension::param_rate;
  if (field.rfind("gpu.reserve.", 0) == 0) return Dimension::bytes;
  if (field == "gpu.memory" || field == "cpu.memory" || field == "cpu.pinned_budget" || field == "nvme.capacity")
    return Dimension::bytes;
  return Dimension::bandwidth;  // gpu.memory_bandwidth, links.*, cpu.memory_bandwidth, nvme.read, nvme.write
}

std::string calibration_yaml(const Calibration& c, const std::string& name) {
  auto value = [&](const std::string& field) -> const Measurement* {
    const Measurement* m = c.find(field);
    return m && m->value > 0 ? m : nullptr;
  };
  std::ostringstream y;
  auto line = [&](const std::string& key, const std::string& text, const std::string& how, int indent) {
    const std::string head = std::string(std::size_t(indent), ' ') + key + ": " + text;
    y << head << std::string(head.size() < 34 ? 34 - head.size() : 1, ' ') << "# " << how << "\n";
  };
  auto field = [&](const std::string& path, const std::string& key, int indent) {
    if (const Measurement* m = value(path)) line(key, format_quantity(m->value, calibration_dimension(path)), m->how, indent);
    else if (const Measurement* n = c.find(path)) y << std::string(std::size_t(indent), ' ') << "# " << key << ": " << n->how << "\n";
  };
  y << "# Written by `memwall calibrate` (" << format_sig(c.seconds, 3) << " s) on this machine, backend " << c.backend
    << " (" << c.device << ")" << (c.ranks > 1 ? ", " + std::to_string(c.ranks) + " ranks" : "") << ".\n"
    << "# Measured fields say how; chosen ones say so; what could not be measured is left out.\n"
    << "# Each operator's time is its median over several block iterations, each transfer's the best of several runs, with "
    << threads_text(c.threads) << "; while it measured (on average), "
    << adam::describe_load(c.load_during) << ".\n"
    << "# The same block's iterations ran up to " << format_sig(100 * c.jitter, 2)
    << " % apart (10th to 90th percentile of a block's iterations, over their median).\n";
  for (const std::string& w : c.warnings) y << "# warning: " << w << "\n";
  y << "name: " << yaml_scalar(name) << "\n";
  y << "description: " << c.backend << " backend of this machine, calibrated by memwall calibrate\n";
  y << "nodes: 1\n";
  y << "gpu:\n";
  line("count_per_node", "1", "one device per rank (memwall run --gpus N under mpirun -np N: one each)", 2);
  field("gpu.memory", "memory", 2);
  field("gpu.memory_bandwidth", "memory_bandwidth", 2);
  field("gpu.peak", "peak", 2);
  field("gpu.shared_peak", "shared_peak", 2);
  if (c.find("gpu.reserve.context")) {
    // whole MiB, rounded up: the profile takes whole bytes, and a reserve errs on the safe side
    y << "  reserve:                        # what CUDA, cuBLAS and NCCL keep beside the training\n";
    for (const char* part : {"context", "workspace", "communicator"}) {
      const Measurement* m = c.find(std::string("gpu.reserve.") + part);
      if (!m) continue;
      if (m->value <= 0 && m->how.rfind("not measured", 0) == 0) {
        y << "    # " << part << ": " << m->how << "\n";
        continue;
      }
      line(part, std::to_string(long(std::ceil(m->value / double(1 << 20)))) + " MiB", m->how, 4);
    }
  }
  y << "  peak_by_hidden:                 # measured: linear layers of one block (see gpu.peak)\n";
  for (const PeakPoint& p : c.peak_by_hidden)
    y << "    - {hidden: " << p.hidden << ", peak: " << format_flops_rate(p.flops_per_s) << "}\n";
  if (!c.gemm.empty()) {
    y << "  gemm:                           # measured: each linear layer's GEMM (M tokens, K in, N out; a tile's when\n"
      << "                                  # tiled), forward + backward FLOPs / time; the simulator takes the nearest shape\n";
    for (const GemmPoint& g : c.gemm)
      y << "    - {m: " << g.m << ", n: " << g.n << ", k: " << g.k << ", rate: " << format_flops_rate(g.flops_per_s) << "}\n";
  }
  if (!c.kernels.empty()) {
    y << "  kernels:                        # measured: the block's other operators, forward + backward, per kind\n";
    for (const KernelRate& kr : c.kernels)
      line(kr.kind, kr.flops_per_s > 0 ? format_flops_rate(kr.flops_per_s) : format_bandwidth(kr.bytes_per_s),
           kr.flops_per_s > 0 ? "operator-graph FLOPs / time" : "operator-graph activation bytes (fp32) / time", 4);
  }
  y << "links:\n";
  field("links.gpu_gpu", "gpu_gpu", 2);
  field("links.pcie_single_gpu", "pcie_single_gpu", 2);
  field("links.pcie_aggregate", "pcie_aggregate", 2);
  line("nic_attach", "cpu", "one machine: ranks talk through host memory", 2);
  y << "cpu:\n";
  field("cpu.memory", "memory", 2);
  field("cpu.memory_bandwidth", "memory_bandwidth", 2);
  field("cpu.adam_throughput", "adam_throughput", 2);
  field("cpu.pinned_budget", "pinned_budget", 2);
  y << "nvme:\n";
  field("nvme.capacity", "capacity", 2);
  field("nvme.read", "read", 2);
  field("nvme.write", "write", 2);
  y << "executor:\n";
  line("backend", c.backend, "memwall run executes plans made for this profile", 2);
  y << "  precision: " << adam::dtype_name(c.precision) << "\n";
  return y.str();
}

}  // namespace memwall::exec
