#include "sim/replay.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <iostream>
#include <cmath>
#include <unordered_map>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "model/op_cost.hpp"
#include "sim/collectives.hpp"
#include "sim/platform.hpp"

namespace memwall::sim {
namespace {

// What an activity will be: SimGrid objects are created only when their last dependency completes.
// SimGrid keeps every live activity in lists it walks when one finishes, so creating the ~10^5
// activities of a paper-sized iteration up front is quadratic; creating them on start keeps only
// the running few alive.
struct Proto {
  sg4::Host* from = nullptr;  // exec: the host
  sg4::Host* to = nullptr;    // comm: the receiver; nullptr for an exec
  double amount = 0;          // flops, bytes
  double bound = 0;           // exec: at most this many flop/s (0: the host's speed)
};

class Dag {
 public:
  int add(const Proto& p) {
    nodes_.push_back({p, {}, 0, -1, -1, nullptr});
    return int(nodes_.size()) - 1;
  }
  void edge(int from, int to) {
    nodes_[size_t(from)].succ.push_back(to);
    nodes_[size_t(to)].pending++;
  }
  // Runs everything; false when some activity never became ready (a cycle across ranks).
  // `progress` (may be empty) hears how far it got, every `interval_s` of wall time at most.
  bool run(sg4::Engine& engine, const std::function<void(std::size_t, std::size_t, double)>& progress = {},
           double interval_s = 1.0) {
    const auto every = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::duration<double>(interval_s));
    auto next = std::chrono::steady_clock::now() + every;
    sg4::Activity::on_completion_cb([this, progress, next, every](const sg4::Activity& a) mutable {
      Node* const mine = a.get_data<Node>();  // launch() tagged each of this Dag's activities with its node
      // std::less: a total order over all pointers, where `<` between an activity's data from
      // another Dag (or none) and this one's nodes is unspecified
      const std::less<const Node*> before;
      if (before(mine, nodes_.data()) || !before(mine, nodes_.data() + nodes_.size())) return;
      Node& n = *mine;
      n.start_s = a.get_start_time();
      n.end_s = a.get_finish_time();
      finished_.push_back(std::move(n.running));
      ++done_;
      if (progress && done_ % 256 == 0 && std::chrono::steady_clock::now() >= next) {
        progress(done_, nodes_.size(), n.end_s);
        next = std::chrono::steady_clock::now() + every;
      }
      for (int s : n.succ)
        if (--nodes_[size_t(s)].pending == 0) launch(s);
    });
    for (int i = 0; i < int(nodes_.size()); ++i)
      if (nodes_[size_t(i)].pending == 0) launch(i);
    engine.run();
    finished_.clear();
    return done_ == nodes_.size();
  }
  const Proto& proto(int i) const { return nodes_[size_t(i)].proto; }
  void set_amount(int i, double amount) { nodes_[size_t(i)].proto.amount = amount; }
  double start_s(int i) const { return nodes_[size_t(i)].start_s; }
  double end_s(int i) const { return nodes_[size_t(i)].end_s; }
  size_t size() const { return nodes_.size(); }
  void reserve(size_t nodes) { nodes_.reserve(nodes); }

 private:
  struct Node {
    Proto proto;
    std::vector<int> succ;
    int pending;
    double start_s, end_s;
    sg4::ActivityPtr running;  // held from its start until it completes
  };
  void launch(int i) {
    if (finished_.size() > 4096) finished_.erase(finished_.begin(), finished_.end() - 64);
    const Proto& p = nodes_[size_t(i)].proto;
    sg4::ActivityPtr a;
    if (p.to == nullptr) {
      sg4::ExecPtr e = sg4::Exec::init();
      e->set_host(p.from)->set_flops_amount(std::max(0.0, p.amount));
      if (p.bound > 0) e->set_bound(p.bound);
      a = e;
    } else {
      sg4::CommPtr c = sg4::Comm::sendto_init(p.from, p.to);
      c->set_payload_size(uint64_t(std::max(1.0, std::round(p.amount))));
      a = c;
    }
    // nodes_ no longer grows once run() starts, so a node's address names it
    a->set_data(&nodes_[size_t(i)]);
    nodes_[size_t(i)].running = a;
    a->start();
  }
  std::vector<Node> nodes_;
  std::vector<sg4::ActivityPtr> finished_;  // released in batches, never inside their own completion
  size_t done_ = 0;
};

// SimGrid's informational lines ("Configuration change ...") are not ours to print.
struct QuietEngineArgs {
  int argc = 2;
  char name[8] = "memwall";
  char quiet[25] = "--log=root.thres:warning";
  char* argv[3] = {name, quiet, nullptr};
};

// Where the replayed GPUs sit and what their collectives span.
struct Layout {
  int dp = 1, mp = 1, pp = 1, ep = 1, gpus_per_node = 1;
  int busy_per_node = 1;  // GPUs of a node that run the schedule, sharing its PCIe root, DRAM, NVMe, CPU, NICs
  Group dp_group, mp_group, ep_group, edp_group, pp_group, tied_group;
  PathRates rates;  // every group's members see the same idle routes
  const Group& group(CommGroup g) const {
    switch (g) {
      case CommGroup::mp: return mp_group;
      case CommGroup::pp: return pp_group;
      case CommGroup::tied: return tied_group;
      case CommGroup::ep: return ep_group;
      case CommGroup::edp: return edp_group;
      default: return dp_group;
    }
  }
};

// One replayed GPU: pipeline stage `s`, dp rank `d`, tensor slice `m`, at `node`/`local` of the
// platform.
struct Gpu {
  int index = 0;  // among all dp x mp x pp GPUs: (s * dp + d) * mp + m
  int s = 0, d = 0, m = 0, node = 0;
  sg4::Host* host = nullptr;
  sg4::Host* compute = nullptr;  // where its operators run: host, or the node's shared cores (gpu.shared_peak)
  std::string name;  // "gpu3"
};

// A step's activities: dependencies point at `heads`, dependents wait for `tail`. Steps that cost
// nothing (release, a checkpoint kept on the GPU) forward their dependencies.
struct StepActs {
  std::vector<int> heads;
  int tail = -1;
  std::vector<int> forward;  // no activity of its own: what a dependent waits for instead
  const char* resource = nullptr;  // the trace's track: "pcie" on this GPU, "nvme" of its node, ...
  bool per_gpu = true;             // the GPU's own resource, or its node's (nvme, cpu)
};

// A collective of the full replay: one per collective step of the schedules, shared by its
// members; it starts when every member has reached it.
struct Instance {
  CollectiveOp op;
  std::vector<int> gpus;  // member -> replayed GPU
  int start = -1, done = -1;
  int arrived = 0;
  std::string hop;
  bool p2p = false;  // a pipeline stage's send matched with its neighbour's receive: gpus = {from, to}
};

Proto comm(sg4::Host* from, sg4::Host* to, double bytes) { return {from, to, bytes}; }
Proto exec(sg4::Host* h, double flops) { return {h, nullptr, flops}; }
Proto delay(const Platform& pf, double s) { return {pf.clock, nullptr, s * pf.clock_speed}; }

// The latency a step of a collective waits for: that of its slowest route.
double step_latency_s(bool intra, bool inter, const PathRates& r) {
  return std::max(intra ? r.intra_latency_s : 0.0, inter ? r.inter_latency_s : 0.0);
}

// Reduction work on a GPU: bytes through HBM, as FLOP-equivalents of the GPU host.
double reduce_flops(double reduce_bytes, double hbm_Bps, sg4::Host* gpu) {
  return hbm_Bps > 0 ? reduce_bytes / hbm_Bps * gpu->get_speed() : 0;
}

// Every member's flows of `op` (member x on GPU `hosts[x]`, on node x / per_node), after `start`
// and before `done`. A member's flows of a round start once its incoming flows of the round before
// have arrived and the step's latency has passed.
void lay_out_every_member(Dag& dag, const Platform& pf, const CollectiveOp& op, const PathRates& r,
                          const std::vector<sg4::Host*>& hosts, double hbm_Bps, int start, int done) {
  const Algorithm algo = pick_algorithm(op, r);
  const FlowPlan plan = member_flows(op, algo);
  const int k = std::max(1, op.group.per_node);
  std::vector<int> ready(hosts.size(), start);  // per member: what its next flows wait for
  std::vector<int> arrived;                     // the last round's latency delays
  for (const std::vector<Flow>& round : plan.rounds) {
    std::vector<std::vector<int>> into(hosts.size());
    std::vector<char> intra(hosts.size(), 0), inter(hosts.size(), 0);
    for (const Flow& f : round) {
      const int x = dag.add(comm(hosts[size_t(f.from)], hosts[size_t(f.to)], f.bytes));
      dag.edge(ready[size_t(f.from)], x);
      into[size_t(f.to)].push_back(x);
      (f.from / k == f.to / k ? intra : inter)[size_t(f.to)] = 1;
    }
    arrived.clear();
    for (size_t m = 0; m < hosts.size(); ++m) {
      if (into[m].empty()) continue;  // a pipeline's root receives nothing and keeps waiting on `start`
      const int d = dag.add(delay(pf, step_latency_s(intra[m], inter[m], r)));
      for (int x : into[m]) dag.edge(x, d);
      ready[m] = d;
      arrived.push_back(d);
    }
  }
  // a pipeline's depth beyond its one round
  const bool spans = op.group.nodes() > 1;
  dag.set_amount(done, plan.extra_latencies * step_latency_s(true, spans, r) * pf.clock_speed);
  for (int x : arrived) dag.edge(x, done);
  if (arrived.empty()) dag.edge(start, done);
  const double reduce = member_traffic(op, algo).reduce_bytes;
  if (reduce > 0 && hbm_Bps > 0)
    for (sg4::Host* h : hosts) {
      const int x = dag.add(exec(h, reduce_flops(reduce, hbm_Bps, h)));
      dag.edge(start, x);
      dag.edge(x, done);
    }
}

// One member of many alike: its own halves of the flows, the stand-ins the others'. NVLink's
// upward direction carries only collectives, the mirror of its downward one, so the member's
// outgoing NVSwitch traffic is left out; its NIC traffic also crosses its PCIe link, which
// carries offload traffic both ways, so both directions go in. The flows of all the steps run as
// one, then the steps' latencies pass. Adds the activities that start together to `heads`; sets
// `tail` when a delay must follow them.
void lay_out_one_member(Dag& dag, const Platform& pf, const CollectiveOp& op, const PathRates& r, sg4::Host* gpu,
                        double hbm_Bps, std::vector<int>& heads, int& tail) {
  const Algorithm algo = pick_algorithm(op, r);
  const MemberTraffic t = member_traffic(op, algo);
  if (t.in_intra > 0) heads.push_back(dag.add(comm(pf.peer, gpu, t.in_intra)));
  if (t.in_inter > 0) heads.push_back(dag.add(comm(pf.fabric, gpu, t.in_inter)));
  if (t.out_inter > 0) heads.push_back(dag.add(comm(gpu, pf.fabric, t.out_inter)));
  if (t.reduce_bytes > 0 && hbm_Bps > 0) heads.push_back(dag.add(exec(gpu, reduce_flops(t.reduce_bytes, hbm_Bps, gpu))));
  if (heads.empty()) return;
  tail = dag.add(delay(pf, t.latencies * step_latency_s(t.in_intra > 0, t.in_inter > 0, r)));
  for (int x : heads) dag.edge(x, tail);
}

class Replayer {
 public:
  Replayer(const HardwareProfile& p, const Platform& pf, const SimOptions& o, const Layout& lay, bool symmetric)
      : p_(p), pf_(pf), o_(o), lay_(lay), sym_(symmetric), peak_(pf.gpu[0]->get_speed()) {}

  // The one loop: every step of `s` through the handler of its kind, linked by its dependencies.
  void add_gpu(const Schedule& s, const Gpu& g) {
    position_[g.index] = int(gpus_.size());
    gpus_.push_back(g);
    sched_ = &s;
    std::vector<StepActs> acts(s.steps.size());
    // Without overlap each step waits for the one before it, except a pipeline stage's sends and
    // receives: posted as soon as their own dependencies allow (Megatron-LM's batched isend and
    // irecv), they hold up only the steps that use their data or buffers. Chained to the rank's
    // other steps, a send waits for a receive its peer posts only after its own blocked steps, and
    // 1F1B deadlocks, plain and interleaved. A group's collectives also wait for the rank's previous
    // one of that group (SimOptions::one_stream: one NCCL stream per communicator).
    int serial = -1;
    std::array<int, kCommGroups> last_collective;  // per group: the rank's latest collective step
    last_collective.fill(-1);
    for (const Step& st : s.steps) {
      StepActs& a = acts[size_t(st.id)];
      a.resource = step_resource(st);
      a.per_gpu = std::string_view(a.resource) != "nvme" && std::string_view(a.resource) != "cpu";
      (this->*kHandlers[size_t(st.kind)])(st, g, a);
      std::vector<int> waits;
      ++stamp_;
      auto wait_for = [&](int x) {
        if (size_t(x) >= seen_.size()) seen_.resize(dag_.size() + 1024, 0);
        if (seen_[size_t(x)] == stamp_) return;
        seen_[size_t(x)] = stamp_;
        waits.push_back(x);
      };
      auto add_waits = [&](const StepActs& d) {
        if (d.tail >= 0) wait_for(d.tail);
        else for (int x : d.forward) wait_for(x);
      };
      for (int d : st.deps) add_waits(acts[size_t(d)]);
      if (o_.one_stream && is_collective(st) && !is_p2p(st) && st.collective.members > 1) {
        int& last = last_collective[size_t(st.collective.group)];  // its communicator's stream
        if (last >= 0) add_waits(acts[size_t(last)]);
        last = st.id;
      }
      if (!o_.overlap && !is_p2p(st)) {
        if (serial >= 0) add_waits(acts[size_t(serial)]);
        serial = st.id;
      }
      compress(waits);
      if (a.heads.empty()) {
        if (waits.size() <= 1) {
          a.forward = waits;
          continue;
        }
        // join, so that dependents wait on one activity rather than a growing set
        a.heads = {dag_.add(delay(0))};
        a.tail = a.heads[0];
      }
      for (int w : waits)
        for (int x : a.heads) dag_.edge(w, x);
      if (a.tail < 0) {
        if (a.heads.size() == 1) {
          a.tail = a.heads[0];
        } else {
          a.tail = dag_.add(delay(0));
          for (int x : a.heads) dag_.edge(x, a.tail);
        }
      }
      steps_.push_back({a.heads.front(), a.tail, &st, int(gpus_.size()) - 1, a.resource, a.per_gpu});
    }
  }

  // Full replay: every instance has all its members; lay out its algorithm's flows.
  Result<bool> finish_collectives() {
    for (Instance& in : instances_) {
      if (in.arrived != int(in.gpus.size()))
        return make_error("the ranks' schedules disagree on their collectives (" + in.hop + ": " +
                          std::to_string(in.arrived) + " of " + std::to_string(in.gpus.size()) + " members)");
      if (in.p2p) {  // one flow from the sending stage's GPU to the receiving one's
        const int flow = dag_.add(comm(host(in.gpus[0]), host(in.gpus[1]), in.op.bytes));
        dag_.edge(in.start, flow);
        dag_.edge(flow, in.done);
        continue;
      }
      std::vector<sg4::Host*> hosts;
      for (int gi : in.gpus) hosts.push_back(host(gi));
      lay_out_every_member(dag_, pf_, in.op, lay_.rates, hosts, p_.gpu_memory_Bps, in.start, in.done);
    }
    return true;
  }

  bool run(sg4::Engine& engine) { return dag_.run(engine, o_.progress, o_.progress_interval_s); }
  // Room for the replayed GPUs' `steps` schedule steps: their activities (1.1-1.7 per step, the
  // joins and a collective's flows included) and records, made once rather than grown.
  void reserve(std::size_t steps) {
    dag_.reserve(steps + steps * 7 / 10);
    steps_.reserve(steps);
  }

  // After a run that left steps waiting: each replayed GPU's first step that never finished, and
  // whether it started (a cycle across ranks leaves each waiting for another's).
  std::string stuck() const {
    std::map<int, const Rec*> first;
    for (const Rec& r : steps_)
      if (dag_.end_s(r.tail) < 0 && !first.count(r.gpu)) first[r.gpu] = &r;
    std::string out;
    for (const auto& [gi, r] : first)
      out += std::string(out.empty() ? "" : "; ") + gpus_[size_t(gi)].name + " at step " + std::to_string(r->step->id) +
             " (" + step_label(*r->step) + (dag_.start_s(r->head) < 0 ? ", never started" : ", started") + ")";
    return out;
  }

  void fill(SimReport& rep) {
    double end = 0;
    for (size_t i = 0; i < dag_.size(); ++i) end = std::max(end, dag_.end_s(int(i)));
    for (const Rec& r : steps_) {
      const double s = dag_.start_s(r.head), f = dag_.end_s(r.tail);
      const char* ph = r.step->phase == Phase::recompute ? "bwd" : to_string(r.step->phase);
      rep.phase_end_s[ph] = std::max(rep.phase_end_s[ph], f);
      if (o_.trace && *r.resource) {
        const Gpu& g = gpus_[size_t(r.gpu)];
        TraceEvent e{step_label(*r.step), r.per_gpu ? g.name + " " + r.resource : node_track(g, r.resource), s, f,
                     r.step->id};
        e.rank = g.index;
        rep.trace.push_back(std::move(e));
      }
    }
    rep.iteration_s = end;
    rep.activities = long(dag_.size());
    // Work done per resource: bytes over every link of each flow's route, FLOP-equivalents per GPU.
    std::unordered_map<const sg4::Link*, double> link_bytes;
    std::unordered_map<const sg4::Host*, double> gpu_flops;
    for (size_t i = 0; i < dag_.size(); ++i) {
      const Proto& p = dag_.proto(int(i));
      if (p.to == nullptr) {
        if (p.from != pf_.clock) gpu_flops[p.from] += p.amount;
        continue;
      }
      for (const sg4::Link* l : pf_.route(p.from, p.to)) link_bytes[l] += p.amount;
    }
    for (const char* k : {"gpu_compute", "pcie", "pcie_root", "nvlink", "dram", "nvme", "cpu"}) rep.busy_fraction[k] = 0;
    if (lay_.dp_group.nodes() > 1) rep.busy_fraction["network"] = 0;
    if (end <= 0) return;
    for (const auto& [h, flops] : gpu_flops)
      rep.busy_fraction["gpu_compute"] = std::max(rep.busy_fraction["gpu_compute"], flops / (h->get_speed() * end));
    for (const auto& [l, bytes] : link_bytes) {
      const std::string k = link_class(*l);
      if (k.empty()) continue;
      rep.busy_fraction[k] = std::max(rep.busy_fraction[k], bytes / (l->get_bandwidth() * end));
    }
  }

 private:
  struct Rec {
    int head, tail;
    const Step* step;
    int gpu;
    const char* resource;
    bool per_gpu;
  };

  // A step that waits for thousands of others (the optimizer waits for every gradient) would cost
  // thousands of edges for each of its steps; runs of 64 waits become one join, made once and
  // shared by every later step that waits for the same run.
  void compress(std::vector<int>& waits) {
    constexpr size_t kRun = 64;
    if (waits.size() < 2 * kRun) return;
    std::vector<int> out;
    size_t i = 0;
    for (; i + kRun <= waits.size(); i += kRun) {
      std::vector<int> run(waits.begin() + long(i), waits.begin() + long(i + kRun));
      auto [it, fresh] = runs_.try_emplace(std::move(run), -1);
      if (fresh) {
        it->second = dag_.add(delay(0));
        for (int x : it->first) dag_.edge(x, it->second);
      }
      out.push_back(it->second);
    }
    out.insert(out.end(), waits.begin() + long(i), waits.end());
    waits = std::move(out);
  }

  Proto delay(double s) const { return sim::delay(pf_, s); }
  sg4::Host* host(int index) const { return gpus_[size_t(position_.at(index))].host; }
  void own(StepActs& a, const Proto& p) { a.heads.push_back(dag_.add(p)); }

  // FLOP-equivalents of a compute step: its seconds at the profile's rates (op_step_seconds, the
  // planner's cost too) at the peak the GPU hosts run at.
  double compute_amount(const Step& st) const {
    if (st.op < 0) return st.flops;
    const ScheduleOp& c = sched_->ops[size_t(st.op)];
    const bool bwd = st.phase == Phase::backward;
    const double flops = bwd ? c.bwd_flops : c.fwd_flops;
    const TrainingConfig& k = sched_->config;
    // the schedule's share of the operator (tensor slice, tile); the embedding has no FLOPs: its
    // tensor slice's (mp_flops_share, as the schedule and the planner take it)
    const double share = flops > 0 ? st.flops / flops : mp_flops_share(c.kind, c.role, k);
    // tiles and tensor slices are thinner GEMMs than the whole layer, at their own rate
    const OpStep s{c.kind, c.role, st.flops, (bwd ? 2 : 1) * c.act_bytes * share, micro_batch_tokens(k), k.mp,
                   st.tile >= 0 ? k.tiling_factor : 1};
    return op_step_seconds(p_, sched_->model, s, peak_) * peak_;
  }

  std::string node_track(const Gpu& g, const char* what) const {
    return pf_.nodes > 1 ? "node" + std::to_string(g.node) + " " + what : what;
  }

  // ---- handlers: one per step kind, each makes the step's activities ----
  using Handler = void (Replayer::*)(const Step&, const Gpu&, StepActs&);
  static const std::array<Handler, kStepKinds> kHandlers;  // indexed by StepKind

  void nothing(const Step&, const Gpu&, StepActs&) {}

  // On the node's shared cores (gpu.shared_peak) a GPU's operator still runs no faster than a GPU alone.
  void compute(const Step& st, const Gpu& g, StepActs& a) {
    Proto p = exec(g.compute, compute_amount(st));
    if (g.compute != g.host) p.bound = peak_;
    own(a, p);
  }

  void optimizer(const Step& st, const Gpu& g, StepActs& a) {
    if (st.src == Tier::cpu) {  // CPU Adam: 30 B per parameter through DRAM, at the cores' rate at most
      own(a, comm(pf_.dram[size_t(g.node)], pf_.adam[size_t(g.node)], st.params * kAdamBytesPerParam));
    } else {  // Adam on the GPU: the same bytes through HBM
      own(a, exec(g.host, gpu_adam_seconds(p_, st.params) * peak_));
    }
  }

  // A pass of `bytes` over memory on the step's tier: through DRAM and the CPU cores (the link CPU
  // Adam's flows take) or through HBM.
  void memory_pass(const Step& st, const Gpu& g, StepActs& a, double bytes) {
    if (bytes <= 0) return;
    if (st.src == Tier::cpu) {
      own(a, comm(pf_.dram[size_t(g.node)], pf_.adam[size_t(g.node)], bytes));
    } else {
      const double t = p_.gpu_memory_Bps > 0 ? bytes / p_.gpu_memory_Bps : 0;
      own(a, exec(g.host, t * peak_));
    }
  }

  // Gradient accumulation's sum: the two gradients read and the sum written.
  void accumulate(const Step& st, const Gpu& g, StepActs& a) { memory_pass(st, g, a, 3 * st.bytes); }

  // Gradient clipping: the sums of squares read the rank's gradients once; the exchange of the sums
  // is a collective of 8 bytes per rank.
  void grad_norm(const Step& st, const Gpu& g, StepActs& a) {
    if (is_collective(st)) collective(st, g, a);
    else memory_pass(st, g, a, st.bytes);
  }

  // Bytes over the links the step's link class crosses, or the collective it takes part in.
  void transfer(const Step& st, const Gpu& g, StepActs& a) {
    if (is_collective(st)) {
      collective(st, g, a);
      return;
    }
    if (st.bytes <= 0) return;
    sg4::Host* dram = pf_.dram[size_t(g.node)];
    switch (st.link) {
      case LinkClass::nvme_cpu:
        own(a, st.src == Tier::nvme ? comm(pf_.nvme[size_t(g.node)], dram, st.bytes)
                                    : comm(dram, pf_.nvme[size_t(g.node)], st.bytes));
        return;
      case LinkClass::cpu_gpu:
        own(a, st.src == Tier::gpu ? comm(g.host, dram, st.bytes) : comm(dram, g.host, st.bytes));
        return;
      default:
        return;
    }
  }

  // The collective a step takes part in, as its spec says (sim/collectives.hpp's terms).
  CollectiveOp collective_of(const Step& st) const {
    const CollectiveSpec& cs = st.collective;
    CollectiveOp op;
    op.group = lay_.group(cs.group);
    op.root = std::max(0, cs.root);
    op.bytes = cs.whole_bytes();
    switch (cs.kind) {
      case CollectiveKind::all_reduce: op.kind = Collective::all_reduce; break;
      case CollectiveKind::reduce_scatter: op.kind = Collective::reduce_scatter; break;
      case CollectiveKind::reduce: op.kind = Collective::reduce; break;
      case CollectiveKind::broadcast: op.kind = Collective::broadcast; break;
      case CollectiveKind::all_to_all: op.kind = Collective::all_to_all; break;
      default: op.kind = Collective::all_gather; break;
    }
    return op;
  }

  void collective(const Step& st, const Gpu& g, StepActs& a) {
    const CollectiveOp op = collective_of(st);
    if (op.group.members <= 1) return;
    const PathRates& r = lay_.rates;
    // a collective over the stages (the gradient norm's exchange, the tied embedding's all-reduce)
    // meets the stages' replayed GPUs
    if (!sym_ || across_stages(st.collective.group)) {
      Instance& in = instance(st, g, op);
      a.heads = {in.start};
      a.tail = in.done;
      return;
    }
    // a member alike every other: its bytes are what it receives (the broadcast's owner: none)
    if (st.bytes > 0) lay_out_one_member(dag_, pf_, op, r, g.host, p_.gpu_memory_Bps, a.heads, a.tail);
  }

  // A pipeline stage's send or receive: the k-th message of a phase from one GPU to its peer in the
  // stage st.root (same dp rank and slice) meets the peer's k-th receive of that phase from it
  // (interleaved stages of two: activations and gradients both go from stage 0 to 1). The all-gather
  // over the slices that makes a received tensor whole is a collective of the mp group.
  void p2p(const Step& st, const Gpu& g, StepActs& a) {
    if (!is_p2p(st)) {
      collective(st, g, a);
      return;
    }
    const int peer = (st.collective.root * lay_.dp + g.d) * lay_.mp + g.m;
    const bool send = st.collective.kind == CollectiveKind::send;
    const int from = send ? g.index : peer, to = send ? peer : g.index;
    const int back = st.phase == Phase::backward;
    const int k = p2p_seq_[{from, to, back, send}]++;
    auto [it, fresh] = p2p_index_.try_emplace({from, to, back, k}, instances_.size());
    if (fresh) {
      Instance in;
      in.p2p = true;
      in.op.bytes = st.bytes;
      in.hop = step_label(st);
      in.gpus = {from, to};
      in.start = dag_.add(delay(0));
      in.done = dag_.add(delay(0));
      instances_.push_back(std::move(in));
    }
    Instance& in = instances_[it->second];
    in.arrived++;
    a.heads = {in.start};
    a.tail = in.done;
  }

  static bool across_stages(CommGroup k) { return k == CommGroup::pp || k == CommGroup::tied; }

  Instance& instance(const Step& st, const Gpu& g, const CollectiveOp& op) {
    const CommGroup kind = st.collective.group;
    // Members share g's stage and: its slice m and (dp) nothing more, (ep) its block of ep
    // consecutive dp ranks, (edp) its place in that block; or (mp) its dp rank d. (pp: g's dp rank
    // and slice, one member per stage; tied: the first and the last stage's.) The member x's dp
    // rank and slice:
    const int ep = std::max(1, lay_.ep);
    auto member = [&](int x) -> std::pair<int, int> {
      switch (kind) {
        case CommGroup::mp: return {g.d, x};
        case CommGroup::ep: return {g.d / ep * ep + x, g.m};
        case CommGroup::edp: return {x * ep + g.d % ep, g.m};
        default: return {x, g.m};
      }
    };
    int group = 0;  // which group of its kind in the stage
    switch (kind) {
      case CommGroup::mp: group = g.d; break;
      case CommGroup::pp:
      case CommGroup::tied: group = g.d * lay_.mp + g.m; break;
      case CommGroup::ep: group = (g.d / ep) * lay_.mp + g.m; break;
      case CommGroup::edp: group = (g.d % ep) * lay_.mp + g.m; break;
      default: group = g.m; break;
    }
    const int seq = seq_[{g.index, int(kind)}]++;
    const int stage = across_stages(kind) ? 0 : g.s;  // the group spans stages
    const long key = (long(stage) * 8 + int(kind)) * (long(lay_.dp) * lay_.mp + 1) + group;
    auto [it, fresh] = index_.try_emplace({key, seq}, instances_.size());
    if (fresh) {
      Instance in;
      in.op = op;
      in.hop = step_label(st);
      const int per_stage = lay_.dp * lay_.mp;
      for (int x = 0; x < op.group.members; ++x) {
        if (across_stages(kind)) {
          const int s = kind == CommGroup::tied && x == 1 ? lay_.pp - 1 : x;
          in.gpus.push_back(s * per_stage + g.d * lay_.mp + g.m);
          continue;
        }
        const auto [d, m] = member(x);
        in.gpus.push_back(g.s * per_stage + d * lay_.mp + m);
      }
      in.start = dag_.add(delay(0));
      in.done = dag_.add(delay(0));
      instances_.push_back(std::move(in));
    }
    Instance& in = instances_[it->second];
    in.op.bytes = std::max(in.op.bytes, op.bytes);
    in.arrived++;
    return in;
  }

  const HardwareProfile& p_;
  const Platform& pf_;
  const SimOptions& o_;
  const Layout& lay_;
  bool sym_;
  double peak_;
  const Schedule* sched_ = nullptr;  // the schedule add_gpu is walking
  std::vector<Gpu> gpus_;  // in the order added
  std::unordered_map<int, int> position_;  // Gpu::index (of all dp x mp x pp) -> gpus_
  std::vector<Rec> steps_;
  std::vector<Instance> instances_;
  std::map<std::pair<long, int>, size_t> index_;  // (stage, group kind and group, sequence number) -> instance
  std::map<std::pair<int, int>, int> seq_;        // (GPU, group kind) -> collectives seen
  std::map<std::tuple<int, int, int, int>, size_t> p2p_index_;  // (from GPU, to GPU, backward?, k) -> instance
  std::map<std::tuple<int, int, int, bool>, int> p2p_seq_;      // (from, to, backward?, the sender's side?) -> messages seen
  std::map<std::vector<int>, int> runs_;         // compress(): a run of waits -> its join
  std::vector<unsigned> seen_;                   // per Dag node: the step that last waited for it
  unsigned stamp_ = 0;
  Dag dag_;
};

// One handler per step kind, in StepKind's order.
const std::array<Replayer::Handler, kStepKinds> Replayer::kHandlers = {
    &Replayer::transfer,   // fetch
    &Replayer::compute,    // compute
    &Replayer::nothing,    // release
    &Replayer::transfer,   // reduce_scatter
    &Replayer::transfer,   // allreduce
    &Replayer::transfer,   // offload
    &Replayer::transfer,   // save_ckpt
    &Replayer::transfer,   // load_ckpt
    &Replayer::optimizer,  // optimizer
    &Replayer::p2p,        // p2p
    &Replayer::accumulate, // accumulate
    &Replayer::transfer,   // all_to_all
    &Replayer::grad_norm,  // grad_norm
};

// What one member's idle routes give when `busy_per_node` GPUs of each node run the same collective.
PathRates path_rates(const HardwareProfile& profile, int busy_per_node) {
  const bool nic_on_root = profile.nic_attach == NicAttach::cpu;
  PathRates r;
  r.intra_Bps = profile.gpu_gpu_Bps > 0 ? profile.gpu_gpu_Bps : profile.pcie_single_gpu_Bps;
  r.intra_latency_s = profile.collective_step_latency_s(false);
  const double nic_Bps = profile.inter_node_Bps > 0 ? profile.inter_node_Bps : profile.pcie_single_gpu_Bps;
  r.inter_Bps = std::min(profile.pcie_single_gpu_Bps, nic_Bps / busy_per_node);
  if (nic_on_root) r.inter_Bps = std::min(r.inter_Bps, profile.pcie_aggregate_Bps / busy_per_node);
  r.inter_latency_s = profile.collective_step_latency_s(true);
  return r;
}

// Where the job's GPUs sit and what their collectives span.
Layout job_layout(const Schedule& s0, const HardwareProfile& profile) {
  const int gpus = s0.dp * s0.config.mp * s0.pp;
  Layout lay;
  lay.dp = s0.dp;
  lay.mp = s0.config.mp;
  lay.pp = s0.pp;
  lay.gpus_per_node = profile.gpus_per_node;
  lay.busy_per_node = profile.ranks_per_node(gpus);
  lay.ep = std::max(1, s0.config.ep);
  const int dp_per_node = std::min(s0.dp, profile.gpus_per_node / s0.config.mp);
  lay.dp_group = {s0.dp, dp_per_node};
  lay.mp_group = {s0.config.mp, s0.config.mp};
  lay.ep_group = {lay.ep, std::min(lay.ep, dp_per_node)};  // consecutive dp ranks
  lay.edp_group = {s0.dp / lay.ep, std::max(1, dp_per_node / lay.ep)};  // every ep-th dp rank
  // stages sit on consecutive GPUs (dp x mp each): a node holds one member of a pp group, or
  // several where several stages fit it
  lay.pp_group = {s0.pp, std::clamp(profile.gpus_per_node / std::max(1, s0.dp * s0.config.mp), 1, s0.pp)};
  lay.tied_group = {2, lay.pp_group.per_node >= s0.pp ? 2 : 1};  // the first and last stage: one node, or two
  lay.rates = path_rates(profile, lay.busy_per_node);
  return lay;
}

// Which GPUs are replayed, on what platform. One GPU per pipeline stage (one in all without
// pipelining) stands for the dp x mp GPUs of its stage, which run its schedule in step, when the
// stages tile the nodes: each stage of whole nodes, or several stages to a node. Otherwise, with
// the broadcast variant, or asked for, every GPU is replayed.
struct ReplayShape {
  bool symmetric = true;
  int per_stage = 1, stages_per_node = 1, replayed = 1;
  PlatformShape platform;
};
ReplayShape replay_shape(const Schedule& s0, const Layout& lay, const HardwareProfile& profile, const SimOptions& options) {
  ReplayShape r;
  const int pp = s0.pp, gpus = s0.dp * s0.config.mp * pp, busy = lay.busy_per_node;
  r.per_stage = s0.dp * s0.config.mp;
  const bool stages_tile = r.per_stage % busy == 0 || busy % r.per_stage == 0;
  // GPUs that share one compute resource (gpu.shared_peak) run at their own peak when alone and
  // split the node's rate when together: that depends on when each computes, so every GPU is replayed
  const bool shared = profile.gpu_shared_peak_flops_per_s > 0 && busy > 1;
  r.symmetric = !options.full && !shared && !s0.broadcast && (pp == 1 || stages_tile);
  r.stages_per_node = r.per_stage >= busy ? 1 : busy / r.per_stage;
  if (r.symmetric) {
    r.platform.nodes = (pp + r.stages_per_node - 1) / r.stages_per_node;
    r.platform.gpus_per_node = std::min(pp, r.stages_per_node);
    r.platform.share = std::min(busy, r.per_stage);
    r.platform.stand_ins = true;
  } else {
    r.platform.nodes = (gpus + profile.gpus_per_node - 1) / profile.gpus_per_node;
    r.platform.gpus_per_node = busy;
  }
  r.replayed = r.symmetric ? pp : gpus;
  return r;
}

// Builds the platform, adds every replayed GPU with its schedule, runs SimGrid and fills `rep`.
Result<bool> replay(const std::vector<const Schedule*>& schedules, const HardwareProfile& profile,
                    const SimOptions& options, const Layout& lay, const ReplayShape& shape, SimReport& rep) {
  if (options.progress) options.progress(0, 0, 0);  // checked; now building (long with --full on many nodes)
  QuietEngineArgs args;
  sg4::Engine engine(&args.argc, args.argv);
  configure_engine(engine);
  Platform pf = build_platform(engine, profile, shape.platform, rep.peak_flops_per_s);
  Replayer rp(profile, pf, options, lay, shape.symmetric);
  std::vector<Gpu> gpus;
  std::size_t steps = 0;
  auto schedule_of = [&](const Gpu& g) -> const Schedule& {
    return *schedules[std::min(size_t(lay.pp > 1 ? g.s : g.d), schedules.size() - 1)];
  };
  for (int r = 0; r < shape.replayed; ++r) {
    Gpu g;
    g.index = shape.symmetric ? r * shape.per_stage : r;  // the stage's first GPU: dp rank 0, slice 0
    g.s = g.index / shape.per_stage;
    g.d = g.index % shape.per_stage / lay.mp;
    g.m = g.index % lay.mp;
    g.node = shape.symmetric ? r / shape.stages_per_node : r / profile.gpus_per_node;
    g.host = pf.gpu_at(g.node, shape.symmetric ? r % shape.stages_per_node : r % profile.gpus_per_node);
    g.compute = pf.cores.empty() ? g.host : pf.cores[size_t(g.node)];
    g.name = "gpu" + std::to_string(g.index);
    steps += schedule_of(g).steps.size();
    gpus.push_back(std::move(g));
  }
  rp.reserve(steps);
  for (const Gpu& g : gpus) rp.add_gpu(schedule_of(g), g);
  if (Result<bool> ok = rp.finish_collectives(); !ok) return make_error(ok.error());
  if (!rp.run(engine))
    return make_error("some steps never became ready (the ranks wait on each other): " + rp.stuck());
  rep.ranks_simulated = shape.replayed;
  rep.nodes_simulated = shape.platform.nodes;
  rep.full = !shape.symmetric;
  rp.fill(rep);
  return true;
}

}  // namespace

Result<SimReport> simulate(const ModelSpec& model, const Placement& placement, const TrainingConfig& config,
                           const HardwareProfile& profile, const SimOptions& options) {
  Result<std::vector<Schedule>> schedules =
      build_schedules(model, placement, config, profile, options.sizes.value_or(MemorySizes{}));
  if (!schedules) return make_error(schedules.error());
  std::vector<const Schedule*> all;
  for (const Schedule& s : *schedules) all.push_back(&s);
  return simulate(all, profile, options);
}

Result<SimReport> simulate(const std::vector<const Schedule*>& schedules, const HardwareProfile& profile,
                           const SimOptions& options) {
  if (schedules.empty()) return make_error("no schedule to replay");
  const Schedule& s0 = *schedules.front();
  const ModelSpec& model = s0.model;
  const Placement& placement = s0.placement;
  const TrainingConfig& c = s0.config;
  const int pp = s0.pp, dp = s0.dp;
  const bool broadcast = s0.broadcast;
  if (broadcast && pp > 1)
    return make_error("--pp: pipeline stages with the broadcast fetch (ZeRO-Offload's owners) are not replayed");

  SimReport rep;
  rep.strategy = placement.name;
  rep.dp = dp;
  rep.mp = c.mp;
  rep.gpus = dp * c.mp * pp;
  rep.pp = pp;
  rep.virtual_stages = std::max(1, c.virtual_stages);
  rep.peak_flops_per_s = profile.peak_flops_per_s(model.hidden);
  // Bandwidth-centric ranks run identical schedules: one serves all. The broadcast variant's differ
  // (one per rank), and so do pipeline stages (one per stage, the same for its dp ranks).
  for (const Schedule* s : schedules) {
    for (int t = 0; t < kTiers; ++t) rep.peak_bytes[size_t(t)] = std::max(rep.peak_bytes[size_t(t)], s->peak_bytes[size_t(t)]);
    if (s->overflow) {
      rep.overflow = s->overflow;
      return rep;
    }
  }
  const size_t expected = size_t(broadcast ? dp : pp);
  if (schedules.size() != expected)
    return make_error(std::to_string(schedules.size()) + " schedules given, the replay needs " +
                      std::to_string(expected) + (broadcast ? " (one per rank of the broadcast variant)" : " (one per pipeline stage)"));

  const Layout lay = job_layout(s0, profile);
  const ReplayShape shape = replay_shape(s0, lay, profile, options);
  if (!shape.symmetric && rep.gpus > kMaxFullReplayGpus) {
    const std::string why = options.full         ? "--full"
                            : broadcast            ? "the broadcast variant"
                            : profile.gpu_shared_peak_flops_per_s > 0 ? "gpu.shared_peak (a node's GPUs share one compute resource)"
                                         : "--pp " + std::to_string(pp) + " with stages of " + std::to_string(shape.per_stage) +
                                             " GPUs (dp x mp) that do not tile nodes of " + std::to_string(lay.busy_per_node) +
                                             " (each stage whole nodes, or whole stages to a node)";
    return make_error(why + " replays every GPU, at most " + std::to_string(kMaxFullReplayGpus) +
                      "; got " + std::to_string(rep.gpus));
  }
  if (Result<bool> ok = replay(schedules, profile, options, lay, shape, rep); !ok) return make_error(ok.error());
  double flops = s0.compute_flops;  // per GPU; with stages their mean
  if (pp > 1) {
    flops = 0;
    for (const Schedule* s : schedules) flops += s->compute_flops / pp;
  }
  rep.tflops_per_gpu = rep.iteration_s > 0 ? flops / rep.iteration_s / 1e12 : 0;
  rep.efficiency = rep.iteration_s > 0 ? flops / rep.iteration_s / rep.peak_flops_per_s : 0;
  return rep;
}

double SimReport::backward_s() const {
  auto f = phase_end_s.find("fwd"), b = phase_end_s.find("bwd");
  return f == phase_end_s.end() || b == phase_end_s.end() ? 0 : b->second - f->second;
}

nlohmann::ordered_json to_json(const SimReport& r, bool with_trace) {
  nlohmann::ordered_json j = {{"strategy", r.strategy}, {"iteration_s", r.iteration_s}, {"tflops_per_gpu", r.tflops_per_gpu},
                      {"efficiency", r.efficiency}, {"peak_flops_per_s", r.peak_flops_per_s}, {"gpus", r.gpus},
                      {"dp", r.dp}, {"mp", r.mp}, {"pp", r.pp}, {"virtual_stages", r.virtual_stages}, {"ranks_simulated", r.ranks_simulated},
                      {"nodes_simulated", r.nodes_simulated}, {"full", r.full}, {"activities", r.activities},
                      {"busy_fraction", r.busy_fraction}, {"phase_end_s", r.phase_end_s}};
  for (Tier t : {Tier::gpu, Tier::cpu, Tier::nvme}) j["peak_bytes"][to_string(t)] = r.peak_bytes[size_t(t)];
  if (r.overflow)
    j["overflow"] = {{"tier", to_string(r.overflow->tier)}, {"step", r.overflow->step},
                     {"needed_bytes", r.overflow->needed_bytes}, {"capacity_bytes", r.overflow->capacity_bytes},
                     {"message", r.overflow->message}};
  if (with_trace && !r.trace.empty()) {  // only when SimOptions::trace asked for it
    nlohmann::ordered_json t = nlohmann::ordered_json::array();
    for (const TraceEvent& e : r.trace) t.push_back({e.name, e.track, e.start_s, e.end_s, e.step, e.rank});
    j["trace"] = std::move(t);
  }
  return j;
}

namespace {

SimReport from_json(const nlohmann::json& j) {
  SimReport r;
  r.strategy = j["strategy"];
  r.iteration_s = j["iteration_s"];
  r.tflops_per_gpu = j["tflops_per_gpu"];
  r.efficiency = j["efficiency"];
  r.peak_flops_per_s = j["peak_flops_per_s"];
  r.gpus = j["gpus"];
  r.dp = j["dp"];
  r.mp = j["mp"];
  r.pp = j.value("pp", 1);
  r.virtual_stages = j.value("virtual_stages", 1);
  r.ranks_simulated = j["ranks_simulated"];
  r.nodes_simulated = j["nodes_simulated"];
  r.full = j["full"];
  r.activities = j["activities"];
  r.busy_fraction = j["busy_fraction"].get<std::map<std::string, double>>();
  for (Tier t : {Tier::gpu, Tier::cpu, Tier::nvme}) r.peak_bytes[size_t(t)] = j["peak_bytes"][to_string(t)].get<double>();
  r.phase_end_s = j["phase_end_s"].get<std::map<std::string, double>>();
  if (j.contains("overflow")) {
    const auto& o = j["overflow"];
    r.overflow = Overflow{*parse_tier(o["tier"].get<std::string>()), o["step"], o["needed_bytes"], o["capacity_bytes"],
                          o["message"]};
  }
  if (j.contains("trace"))
    for (const auto& e : j["trace"]) {
      TraceEvent t{e[0].get<std::string>(), e[1].get<std::string>(), e[2].get<double>(), e[3].get<double>(),
                   e[4].get<int>()};
      t.rank = e[5].get<int>();
      r.trace.push_back(std::move(t));
    }
  return r;
}

// Runs `work` in a forked child (SimGrid keeps one engine per process) and returns what it wrote:
// a JSON document, {"error": ...} for a failure.
Result<nlohmann::json> in_child(const std::function<nlohmann::json()>& work) {
  int fd[2];
  if (pipe(fd) != 0) return make_error(std::string("pipe: ") + std::strerror(errno));
  // what the caller has buffered is printed by the caller, not once more by the child
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) return make_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    close(fd[0]);
    std::string out = work().dump();
    for (size_t off = 0; off < out.size();) {
      ssize_t n = write(fd[1], out.data() + off, out.size() - off);
      if (n <= 0) _exit(3);
      off += size_t(n);
    }
    _exit(0);
  }
  close(fd[1]);
  std::string text;
  char buf[65536];
  for (ssize_t n; (n = read(fd[0], buf, sizeof buf)) > 0;) text.append(buf, size_t(n));
  close(fd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || text.empty())
    return make_error("the simulation process failed (status " + std::to_string(status) + ")");
  nlohmann::json j = nlohmann::json::parse(text);
  if (j.is_object() && j.contains("error")) return make_error(j["error"].get<std::string>());
  return j;
}

}  // namespace

Result<SimReport> simulate_isolated(const ModelSpec& model, const Placement& placement, const TrainingConfig& config,
                                    const HardwareProfile& profile, const SimOptions& options) {
  Result<nlohmann::json> j = in_child([&]() {
    Result<SimReport> r = simulate(model, placement, config, profile, options);
    return r ? nlohmann::json(to_json(*r, true)) : nlohmann::json{{"error", r.error()}};
  });
  if (!j) return make_error(j.error());
  return from_json(*j);
}

RankingReplay replay_for_ranking(const ModelSpec& model, const Placement& placement, const TrainingConfig& config,
                                 const HardwareProfile& profile, std::optional<MemorySizes> sizes) {
  if (placement.fetch == ParamFetch::broadcast)
    return {std::nullopt, "broadcast fetch: its replay is too slow for a planning loop"};
  SimOptions o;
  o.sizes = sizes;
  const Result<SimReport> r = simulate_isolated(model, placement, config, profile, o);
  if (!r) return {std::nullopt, "the simulation failed: " + r.error()};
  if (r->overflow) return {std::nullopt, "the schedule overflows: " + r->overflow->message};
  if (!(r->iteration_s > 0)) return {std::nullopt, "the simulation gave no iteration time"};
  return {r->iteration_s, ""};
}

namespace {

Result<double> collective_here(const HardwareProfile& profile, const CollectiveOp& op, bool full) {
  if (op.group.members < 1 || op.group.per_node < 1 || op.group.per_node > profile.gpus_per_node ||
      op.group.nodes() > std::max(1, profile.nodes))
    return make_error("simulate_collective: the group does not fit the profile");
  QuietEngineArgs args;
  sg4::Engine engine(&args.argc, args.argv);
  configure_engine(engine);
  const int k = std::min(op.group.per_node, op.group.members);
  const PathRates r = path_rates(profile, k);
  PlatformShape shape;
  if (full) {
    shape.nodes = op.group.nodes();
    shape.gpus_per_node = k;
  } else {
    shape.share = k;
    shape.stand_ins = true;
  }
  Platform pf = build_platform(engine, profile, shape, profile.gpu_peak_flops_per_s);
  Dag dag;
  if (full) {
    std::vector<sg4::Host*> hosts;
    for (int x = 0; x < op.group.members; ++x) hosts.push_back(pf.gpu_at(x / k, x % k));
    const int start = dag.add(delay(pf, 0)), done = dag.add(delay(pf, 0));
    lay_out_every_member(dag, pf, op, r, hosts, profile.gpu_memory_Bps, start, done);
  } else {
    std::vector<int> heads;
    int tail = -1;
    lay_out_one_member(dag, pf, op, r, pf.gpu[0], profile.gpu_memory_Bps, heads, tail);
  }
  if (!dag.run(engine)) return make_error("simulate_collective: some flows never started");
  double end = 0;
  for (size_t i = 0; i < dag.size(); ++i) end = std::max(end, dag.end_s(int(i)));
  return end;
}

}  // namespace

Result<double> simulate_collective(const HardwareProfile& profile, const CollectiveOp& op, bool full) {
  Result<nlohmann::json> j = in_child([&]() {
    Result<double> r = collective_here(profile, op, full);
    return r ? nlohmann::json(*r) : nlohmann::json{{"error", r.error()}};
  });
  if (!j) return make_error(j.error());
  return j->get<double>();
}

std::string chrome_trace_json(const SimReport& rep) {
  return memwall::chrome_trace_json(rep.trace, "memwall simulate (" + rep.strategy + ")");
}

}  // namespace memwall::sim
