#include "sim/replay.hpp"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <variant>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <nlohmann/json.hpp>

#include "sim/platform.hpp"

namespace memwall::sim {
namespace {

// What an activity will be: SimGrid objects are created only when their last dependency completes.
// SimGrid keeps every live activity in lists it walks when one finishes, so creating the ~10^5
// activities of a paper-sized iteration up front is quadratic; creating them on start keeps only
// the running few alive.
struct Proto {
  enum class Kind { exec, comm, io } kind = Kind::exec;
  sg4::Host* from = nullptr;  // exec: the host
  sg4::Host* to = nullptr;
  sg4::Disk* disk = nullptr;
  double amount = 0;  // flops, bytes
  bool read = true;
};

class Dag {
 public:
  int add(const Proto& p) {
    nodes_.push_back({p, {}, 0, 0, 0});
    return int(nodes_.size()) - 1;
  }
  void edge(int from, int to) {
    nodes_[from].succ.push_back(to);
    nodes_[to].pending++;
  }
  void run(sg4::Engine& engine) {
    sg4::Activity::on_completion_cb([this](const sg4::Activity& a) {
      auto it = live_.find(&a);
      if (it == live_.end()) return;
      Node& n = nodes_[it->second];
      n.start_s = a.get_start_time();
      n.end_s = a.get_finish_time();
      finished_.push_back(std::move(held_[it->second]));
      held_.erase(it->second);
      live_.erase(it);
      for (int s : n.succ)
        if (--nodes_[s].pending == 0) launch(s);
    });
    for (int i = 0; i < int(nodes_.size()); ++i)
      if (nodes_[i].pending == 0) launch(i);
    engine.run();
    finished_.clear();
  }
  double start_s(int i) const { return nodes_[i].start_s; }
  double end_s(int i) const { return nodes_[i].end_s; }
  size_t size() const { return nodes_.size(); }

 private:
  struct Node {
    Proto proto;
    std::vector<int> succ;
    int pending;
    double start_s, end_s;
  };
  void launch(int i) {
    if (finished_.size() > 4096) finished_.erase(finished_.begin(), finished_.end() - 64);
    const Proto& p = nodes_[i].proto;
    sg4::ActivityPtr a;
    switch (p.kind) {
      case Proto::Kind::exec: {
        sg4::ExecPtr e = sg4::Exec::init();
        e->set_host(p.from)->set_flops_amount(std::max(0.0, p.amount));
        a = e;
        break;
      }
      case Proto::Kind::comm: {
        sg4::CommPtr c = sg4::Comm::sendto_init(p.from, p.to);
        c->set_payload_size(uint64_t(std::max(1.0, std::round(p.amount))));
        a = c;
        break;
      }
      case Proto::Kind::io:
        a = p.disk->io_init(sg_size_t(std::max(1.0, std::round(p.amount))),
                            p.read ? sg4::Io::OpType::READ : sg4::Io::OpType::WRITE);
        break;
    }
    live_[a.get()] = i;
    held_[i] = a;
    a->start();
  }
  std::vector<Node> nodes_;
  std::unordered_map<const sg4::Activity*, int> live_;
  std::unordered_map<int, sg4::ActivityPtr> held_;
  std::vector<sg4::ActivityPtr> finished_;  // released in batches, never inside their own completion
};

// A step's activities and how to wait for it. Steps that cost nothing (release, a checkpoint kept
// on the GPU) forward their dependencies.
struct StepActs {
  std::vector<int> own;   // Dag nodes: what this step does
  std::vector<int> done;  // what a dependent waits for
  std::string track;
};

class Replayer {
 public:
  // `symmetric`: one rank stands for all (platform built with share = ranks_in_node); collective
  // traffic from the other GPUs of the node arrives from the platform's peer host.
  Replayer(const HardwareProfile& p, const Platform& pf, const SimOptions& o, int mp, int dp, int ranks_in_node,
           int nodes_spanned, bool symmetric)
      : p_(p), pf_(pf), o_(o), mp_(mp), dp_(dp), local_(ranks_in_node), nodes_(nodes_spanned), sym_(symmetric) {}

  void add_rank(const Schedule& s, int li) {
    sg4::Host* gpu = pf_.gpu_at(0, li * mp_);
    std::vector<StepActs> acts(s.steps.size());
    const std::string G = "gpu" + std::to_string(li * mp_);
    for (const Step& st : s.steps) {
      StepActs& a = acts[st.id];
      make(st, li, gpu, G, a);
      std::vector<int> waits;
      auto add_waits = [&](const StepActs& d) {
        for (int x : d.done)
          if (std::find(waits.begin(), waits.end(), x) == waits.end()) waits.push_back(x);
      };
      for (int d : st.deps) add_waits(acts[d]);
      if (!o_.overlap && st.id > 0) add_waits(acts[st.id - 1]);
      if (a.own.empty()) {
        if (waits.size() > 1) {  // join so that dependents wait on one activity, not a growing set
          a.own.push_back(dag_.add(exec(gpu, 0)));
        } else {
          a.done = waits;
          continue;
        }
      }
      for (int w : waits)
        for (int x : a.own) dag_.edge(w, x);
      if (a.own.size() > 1) {
        int j = dag_.add(exec(gpu, 0));
        for (int x : a.own) dag_.edge(x, j);
        a.done = {j};
        ++joins_;
      } else {
        a.done = a.own;
      }
      for (auto& x : a.own) all_.push_back({x, st.id, a.track, step_label(st), li, st.phase});
    }
  }

  void run(sg4::Engine& engine) { dag_.run(engine); }

  void fill(SimReport& rep) {
    double end = 0;
    std::map<std::string, std::vector<std::pair<double, double>>> by_class;
    for (auto& r : all_) {
      double s = dag_.start_s(r.act), f = dag_.end_s(r.act);
      end = std::max(end, f);
      const char* ph = r.phase == Phase::recompute ? "bwd" : to_string(r.phase);
      rep.phase_end_s[ph] = std::max(rep.phase_end_s[ph], f);
      if (r.track.empty()) continue;  // joins: bookkeeping, not work
      by_class[klass(r.track)].push_back({s, f});
      if (o_.trace) rep.trace.push_back({r.name, r.track, s, f, r.step});
    }
    rep.iteration_s = end;
    rep.activities = long(dag_.size());
    for (auto& [k, iv] : by_class) {
      std::sort(iv.begin(), iv.end());
      double busy = 0, cs = -1, ce = -1;
      for (auto [s, f] : iv) {
        if (s > ce) {
          if (ce > cs) busy += ce - cs;
          cs = s;
          ce = f;
        } else {
          ce = std::max(ce, f);
        }
      }
      if (ce > cs) busy += ce - cs;
      rep.busy_fraction[k] = end > 0 ? busy / end : 0;
    }
  }

 private:
  struct Rec {
    int act;
    int step;
    std::string track, name;
    int rank;
    Phase phase;
  };

  // "gpu3 pcie" -> "pcie": busy fractions are per resource class, the union over its instances.
  static std::string klass(const std::string& track) {
    auto sp = track.rfind(' ');
    return sp == std::string::npos ? track : track.substr(sp + 1);
  }

  static Proto comm(sg4::Host* from, sg4::Host* to, double bytes) {
    return {Proto::Kind::comm, from, to, nullptr, bytes, true};
  }
  static Proto exec(sg4::Host* h, double amount) { return {Proto::Kind::exec, h, nullptr, nullptr, amount, true}; }
  Proto io(bool read, double bytes) const { return {Proto::Kind::io, nullptr, nullptr, pf_.nvme[0], bytes, read}; }
  void own(StepActs& a, const Proto& p) { a.own.push_back(dag_.add(p)); }

  // The flows of a collective that delivers `whole` bytes' worth to this rank: hierarchical, the
  // node's share of remote data through its NIC, the rest from local peers over NVSwitch.
  void gather_flows(int li, sg4::Host* gpu, double whole, StepActs& a) {
    const double remote = nodes_ > 1 ? whole * (nodes_ - 1) / (double(nodes_) * local_) : 0;
    if (remote > 0 && pf_.fabric) own(a, comm(pf_.fabric, gpu, remote));
    if (sym_) {
      if (local_ > 1) own(a, comm(pf_.peer, gpu, whole * (local_ - 1) / local_));
      return;
    }
    for (int j = 0; j < local_; ++j)
      if (j != li) own(a, comm(pf_.gpu_at(0, j * mp_), gpu, whole / local_));
  }

  void make(const Step& st, int li, sg4::Host* gpu, const std::string& G, StepActs& a) {
    sg4::Host* cpu = pf_.cpu[0];
    switch (st.kind) {
      case StepKind::compute:
        a.track = G + " gpu_compute";
        own(a, exec(gpu, st.flops));
        return;
      case StepKind::optimizer:
        if (st.src == Tier::cpu) {
          a.track = "cpu";
          own(a, exec(cpu, st.params));  // CPU host speed is Adam params/s
        } else {
          a.track = G + " gpu_compute";
          own(a, exec(gpu, st.params * 32.0 / o_.gpu_hbm_Bps * pf_.gpu[0]->get_speed()));
        }
        return;
      case StepKind::release:
        return;
      default:
        break;
    }
    if (st.bytes <= 0) return;
    switch (st.link) {
      case LinkClass::none:
        return;
      case LinkClass::nvme_cpu:
        a.track = "nvme";
        own(a, io(st.src == Tier::nvme, st.bytes));
        return;
      case LinkClass::cpu_gpu:
        a.track = G + " pcie";
        own(a, st.src == Tier::gpu ? comm(gpu, cpu, st.bytes) : comm(cpu, gpu, st.bytes));
        return;
      case LinkClass::gpu_gpu:
      case LinkClass::network: {
        a.track = st.link == LinkClass::network ? "network" : G + " nvlink";
        if (st.hop == "mp") {  // Megatron all-reduce among the mp GPUs of this rank
          if (sym_) {
            own(a, comm(pf_.peer, gpu, st.bytes));
            return;
          }
          for (int k = 1; k < mp_; ++k) own(a, comm(pf_.gpu_at(0, li * mp_ + k), gpu, st.bytes / (mp_ - 1)));
          return;
        }
        if (st.hop == "bcast") {  // the owner sends the whole parameter
          sg4::Host* owner = local_ > 1 ? pf_.gpu_at(0, ((li + 1) % local_) * mp_) : pf_.fabric;
          if (owner) own(a, comm(owner, gpu, st.bytes));
          return;
        }
        double factor = st.kind == StepKind::allreduce ? 2.0 : 1.0;  // reduce-scatter + all-gather
        double whole = st.bytes / factor * dp_ / std::max(1, dp_ - 1);
        for (int r = 0; r < int(factor); ++r) gather_flows(li, gpu, whole, a);
        return;
      }
    }
  }

  const HardwareProfile& p_;
  const Platform& pf_;
  const SimOptions& o_;
  int mp_, dp_, local_, nodes_;
  bool sym_;
  std::vector<Rec> all_;
  long joins_ = 0;
  Dag dag_;
};

}  // namespace

Result<SimReport> simulate(const ModelSpec& model, const Placement& placement, const TrainingConfig& config,
                           const HardwareProfile& profile, const SimOptions& options) {
  TrainingConfig c = config;
  if (Result<Schedule> check = build_schedule(model, placement, c, profile, 0); !check) return make_error(check.error());
  const int dp = c.dp > 0 ? c.dp : profile.total_gpus() / c.mp;
  c.dp = dp;
  const int per_node = std::max(1, profile.gpus_per_node / c.mp);
  const int local = std::min(dp, per_node);
  const int nodes_spanned = (dp + per_node - 1) / per_node;

  SimReport rep;
  rep.strategy = placement.name;
  rep.dp = dp;
  rep.mp = c.mp;
  rep.gpus = dp * c.mp;
  rep.peak_flops_per_s = profile.peak_flops_per_s(model.hidden);
  rep.nodes_simulated = 1;

  std::vector<Schedule> schedules;
  for (int r = 0; r < local; ++r) {
    Result<Schedule> s = build_schedule(model, placement, c, profile, r);
    if (!s) return make_error(s.error());
    if (s->overflow) {
      rep.overflow = s->overflow;
      rep.peak_bytes = s->peak_bytes;
      return rep;
    }
    schedules.push_back(std::move(s).value());
    // Ranks are identical under bandwidth-centric partitioning: one schedule serves all.
    if (placement.fetch == ParamFetch::allgather) break;
  }
  rep.peak_bytes = schedules[0].peak_bytes;

  // SimGrid's informational lines ("Configuration change ...") are not ours to print.
  int argc = 2;
  char name[] = "memwall";
  char quiet[] = "--log=root.thres:warning";
  char* argv[] = {name, quiet, nullptr};
  sg4::Engine engine(&argc, argv);
  configure_engine(engine);
  // Ranks are identical under bandwidth-centric partitioning: replay one and give it 1/local of
  // every shared resource. The broadcast variant is not symmetric: replay every rank of the node.
  const bool symmetric = placement.fetch == ParamFetch::allgather || dp == 1;
  const int replayed = symmetric ? 1 : local;
  rep.ranks_simulated = replayed;
  Platform pf = build_platform(engine, profile, 1, rep.peak_flops_per_s, symmetric ? local : 1);
  Replayer rp(profile, pf, options, c.mp, dp, local, nodes_spanned, symmetric);
  for (int r = 0; r < replayed; ++r) rp.add_rank(schedules[std::min<size_t>(r, schedules.size() - 1)], r);
  rp.run(engine);
  rp.fill(rep);
  const double flops = schedules[0].compute_flops;
  rep.tflops_per_gpu = rep.iteration_s > 0 ? flops / rep.iteration_s / 1e12 : 0;
  rep.efficiency = rep.iteration_s > 0 ? flops / rep.iteration_s / rep.peak_flops_per_s : 0;
  return rep;
}

double SimReport::backward_s() const {
  auto f = phase_end_s.find("fwd"), b = phase_end_s.find("bwd");
  return f == phase_end_s.end() || b == phase_end_s.end() ? 0 : b->second - f->second;
}

namespace {

nlohmann::json to_json(const SimReport& r) {
  nlohmann::json j = {{"strategy", r.strategy}, {"iteration_s", r.iteration_s}, {"tflops_per_gpu", r.tflops_per_gpu},
                      {"efficiency", r.efficiency}, {"peak_flops_per_s", r.peak_flops_per_s}, {"gpus", r.gpus},
                      {"dp", r.dp}, {"mp", r.mp}, {"ranks_simulated", r.ranks_simulated},
                      {"nodes_simulated", r.nodes_simulated}, {"activities", r.activities},
                      {"busy_fraction", r.busy_fraction}, {"peak_bytes", r.peak_bytes}, {"phase_end_s", r.phase_end_s}};
  if (r.overflow)
    j["overflow"] = {{"tier", int(r.overflow->tier)}, {"step", r.overflow->step},
                     {"needed_bytes", r.overflow->needed_bytes}, {"capacity_bytes", r.overflow->capacity_bytes},
                     {"message", r.overflow->message}};
  if (!r.trace.empty()) {  // only when SimOptions::trace asked for it
    nlohmann::json t = nlohmann::json::array();
    for (const TraceEvent& e : r.trace) t.push_back({e.name, e.track, e.start_s, e.end_s, e.step});
    j["trace"] = std::move(t);
  }
  return j;
}

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
  r.ranks_simulated = j["ranks_simulated"];
  r.nodes_simulated = j["nodes_simulated"];
  r.activities = j["activities"];
  r.busy_fraction = j["busy_fraction"].get<std::map<std::string, double>>();
  r.peak_bytes = j["peak_bytes"].get<std::array<double, kTiers>>();
  r.phase_end_s = j["phase_end_s"].get<std::map<std::string, double>>();
  if (j.contains("overflow")) {
    const auto& o = j["overflow"];
    r.overflow = Overflow{Tier(o["tier"].get<int>()), o["step"], o["needed_bytes"], o["capacity_bytes"], o["message"]};
  }
  if (j.contains("trace"))
    for (const auto& e : j["trace"])
      r.trace.push_back({e[0].get<std::string>(), e[1].get<std::string>(), e[2].get<double>(), e[3].get<double>(),
                         e[4].get<int>()});
  return r;
}

}  // namespace

Result<SimReport> simulate_isolated(const ModelSpec& model, const Placement& placement, const TrainingConfig& config,
                                    const HardwareProfile& profile, const SimOptions& options) {
  int fd[2];
  if (pipe(fd) != 0) return make_error(std::string("simulate: pipe: ") + std::strerror(errno));
  pid_t pid = fork();
  if (pid < 0) return make_error(std::string("simulate: fork: ") + std::strerror(errno));
  if (pid == 0) {
    close(fd[0]);
    Result<SimReport> r = simulate(model, placement, config, profile, options);
    std::string out = r ? to_json(*r).dump() : nlohmann::json{{"error", r.error()}}.dump();
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
    return make_error("simulate: the simulation process failed (status " + std::to_string(status) + ")");
  nlohmann::json j = nlohmann::json::parse(text);
  if (j.contains("error")) return make_error(j["error"].get<std::string>());
  return from_json(j);
}

std::string chrome_trace_json(const SimReport& rep) {
  return memwall::chrome_trace_json(rep.trace, "node 0 (" + rep.strategy + ")");
}

}  // namespace memwall::sim
