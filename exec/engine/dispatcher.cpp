#include "exec/engine/dispatcher.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <queue>
#include <thread>

#include "exec/engine/handlers.hpp"
#include "model/units.hpp"

namespace memwall::exec {
namespace {

using Clock = std::chrono::steady_clock;

std::string describe(const Step& s) { return "step " + std::to_string(s.id) + " (" + step_label(s) + ")"; }

// The group a collective step talks to and its members' world ranks: " over the pp group (world
// ranks 1, 3)"; a send or receive names its peer; "" for any other step.
std::string group_words(const EngineContext& e, const Step& s) {
  if (!is_collective(s)) return "";
  auto world = [&](int stage, int d, int m) { return e.world_rank_of(stage, d, m); };
  std::vector<int> ranks;
  switch (s.collective.group) {
    case CommGroup::mp:
      for (int m = 0; m < e.mp; ++m) ranks.push_back(world(e.stage, e.rank, m));
      break;
    case CommGroup::pp:
      if (is_p2p(s)) return " with world rank " + std::to_string(world(s.collective.root, e.rank, e.mp_rank)) + " (pp group)";
      for (int st = 0; st < e.pp; ++st) ranks.push_back(world(st, e.rank, e.mp_rank));
      break;
    case CommGroup::tied:
      ranks = {world(0, e.rank, e.mp_rank), world(e.pp - 1, e.rank, e.mp_rank)};
      break;
    default:  // dp (and ep / edp, which the executor does not run)
      for (int d = 0; d < e.dp; ++d) ranks.push_back(world(e.stage, d, e.mp_rank));
      break;
  }
  std::string out = std::string(" over the ") + to_string(s.collective.group) + " group (world ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out + ")";
}

// The time a step takes on idle resources of `p`: what the watchdog allows it (many times over).
double expected_time(const Step& s, const HardwareProfile& p, long hidden) {
  auto over = [](double amount, double rate) { return rate > 0 ? amount / rate : 0.0; };
  switch (s.kind) {
    case StepKind::compute: return over(s.flops, p.peak_flops_per_s(hidden));
    case StepKind::optimizer:
      return s.src == Tier::cpu ? over(s.params, p.cpu_adam_params_per_s) : over(s.params * 30, p.gpu_memory_Bps);
    case StepKind::accumulate:
      return over(3 * s.bytes, s.src == Tier::cpu ? p.cpu_memory_Bps : p.gpu_memory_Bps);
    case StepKind::grad_norm:
      if (!is_collective(s)) return over(s.bytes, s.src == Tier::cpu ? p.cpu_memory_Bps : p.gpu_memory_Bps);
      break;
    default: break;
  }
  switch (s.link) {
    case LinkClass::nvme_cpu: return over(s.bytes, std::min(p.nvme_read_Bps, p.nvme_write_Bps));
    case LinkClass::cpu_gpu: return over(s.bytes, p.pcie_single_gpu_Bps);
    case LinkClass::gpu_gpu: return over(s.bytes, p.gpu_gpu_Bps > 0 ? p.gpu_gpu_Bps : p.pcie_single_gpu_Bps);
    case LinkClass::network: return over(s.bytes, p.inter_node_Bps > 0 ? p.inter_node_Bps : p.pcie_single_gpu_Bps);
    case LinkClass::none: return 0;
  }
  return 0;
}

// nullopt: still running; "" done; else the error. A token with a second stage starts it here.
std::optional<std::string> poll(EngineContext& e, Token& t) {
  std::optional<std::string> r;
  switch (t.kind) {
    case Token::none: r = std::string(); break;
    case Token::event:
      if (!e.k().event_query(e.cx(), t.ev)) return std::nullopt;
      e.event_pool.push_back(t.ev);
      t.ev = nullptr;
      r = std::string();
      break;
    case Token::io: {
      if (!t.handle.done()) return std::nullopt;
      io::Status st = t.handle.wait();
      r = st ? std::string() : st.error();
      break;
    }
    case Token::host:
      if (!t.task->done.load(std::memory_order_acquire)) return std::nullopt;
      r = t.task->error;
      break;
    case Token::collective:
      for (std::unique_ptr<CollectiveOp>& op : t.ops) {
        if (!op) continue;
        Result<bool> done = op->test();
        if (!done) return done.error();
        if (!*done) return std::nullopt;
        op.reset();
      }
      r = std::string();
      break;
  }
  if (!r->empty() || !t.then) return r;
  auto then = std::move(t.then);
  Result<Token> next = then();
  if (!next) return next.error();
  t = std::move(next).value();
  return poll(e, t);
}

// Progress anywhere: completions here, pieces of host work, blocks the io engine moved, and other
// ranks' completions (one node). The watchdog restarts its clock whenever this changes.
std::uint64_t progress_signature(EngineContext& e, std::size_t finished) {
  std::uint64_t sig = finished + (e.lane ? e.lane->progress() : 0);
  if (io::IoEngine* io = e.tiers.io()) {
    const io::IoCounters c = io->counters();
    sig += c.bytes_read + c.bytes_written + c.errors;
  }
  if (e.peer_progress) sig += e.peer_progress();
  return sig;
}

class Loop {
 public:
  Loop(EngineContext& e, const DispatchTables& t, std::vector<StepTime>& times)
      : e_(e), t_(t), steps_(e.sched->steps), times_(times), pending_(t.waits), tok_(steps_.size()) {
    times_.assign(steps_.size(), StepTime{});
    for (const Step& s : steps_) times_[size_t(s.id)].step = s.id;
    for (const Step& s : steps_)
      if (pending_[size_t(s.id)] == 0) ready_.push(s.id);
    e_.bytes_moved = {};
  }

  Result<bool> run() {
    const std::size_t count = steps_.size();
    last_change_ = now();
    int backoff_us = 1;
    while (finished_ < count) {
      bool moved = issue_ready();
      moved = poll_inflight() || moved;
      if (e_.k().sticky_error)
        if (const char* err = e_.k().sticky_error(e_.cx()); err && error_.empty()) error_ = e_.be->caps().name + ": " + err;
      if (!error_.empty() && inflight_.empty()) break;
      if (inflight_.empty() && ready_.empty() && finished_ < count) {
        if (error_.empty()) error_ = "internal error: steps wait for dependencies that never run";
        break;
      }
      if (moved) {
        backoff_us = 1;
        continue;
      }
      if (error_.empty() && stuck()) break;
      std::this_thread::sleep_for(std::chrono::microseconds(backoff_us));
      backoff_us = std::min(200, backoff_us * 2);
    }
    if (!error_.empty()) {
      drain();
      return make_error(error_);
    }
    return true;
  }

 private:
  double now() const { return std::chrono::duration<double>(Clock::now() - t0_).count(); }

  // Issues whatever has its dependencies done: the lowest id first, collectives in schedule order.
  bool issue_ready() {
    bool any = false;
    while (error_.empty() && !ready_.empty()) {
      const int id = ready_.top();
      if (e_.o.serial && (!inflight_.empty() || id != next_serial_)) break;
      ready_.pop();
      const Step& s = steps_[size_t(id)];
      if (is_collective(s) && (next_collective_ >= t_.collectives.size() || t_.collectives[next_collective_] != id)) {
        parked_.push_back(id);  // every rank issues its collectives in the same order: the schedule's
        continue;
      }
      issue(s);
      any = true;
    }
    return any;
  }

  void issue(const Step& s) {
    times_[size_t(s.id)].start_s = now();
    for (int b : s.allocs) {
      const Buffer& buf = e_.sched->buffers[size_t(b)];
      const size_t t = size_t(buf.tier);
      e_.live_bytes[t] += buf.arena_bytes;
      e_.live_high_water[t] = std::max(e_.live_high_water[t], e_.live_bytes[t]);
      e_.extent_high_water[t] = std::max(e_.extent_high_water[t], std::size_t(buf.offset + buf.arena_bytes));
      if (buf.kind == BufferKind::grad)  // gradients accumulate into it: it starts at zero
        e_.k().memset_zero(e_.cx(), e_.buffer(b), std::size_t(buf.bytes));
    }
    Result<Token> t = issue_step(e_, s);
    ++next_serial_;
    if (!t) {
      error_ = describe(s) + ": " + t.error();
      return;
    }
    tok_[size_t(s.id)] = std::move(t).value();
    inflight_.push_back(s.id);
    if (is_collective(s)) {
      ++next_collective_;
      if (next_collective_ < t_.collectives.size()) {
        auto it = std::find(parked_.begin(), parked_.end(), t_.collectives[next_collective_]);
        if (it != parked_.end()) {
          ready_.push(*it);
          parked_.erase(it);
        }
      }
    }
  }

  bool poll_inflight() {
    bool any = false;
    for (std::size_t i = 0; i < inflight_.size();) {
      const int id = inflight_[i];
      std::optional<std::string> r = poll(e_, tok_[size_t(id)]);
      if (!r) {
        ++i;
        continue;
      }
      any = true;
      inflight_.erase(inflight_.begin() + long(i));
      const Step& s = steps_[size_t(id)];
      times_[size_t(id)].end_s = now();
      if (!r->empty()) {
        if (error_.empty()) error_ = describe(s) + ": " + *r;
        continue;
      }
      complete(s);
    }
    return any;
  }

  void complete(const Step& s) {
    if (s.link != LinkClass::none && s.bytes > 0) e_.bytes_moved[int(s.link)] += s.bytes;
    for (int b : s.frees) {
      const Buffer& buf = e_.sched->buffers[size_t(b)];
      e_.live_bytes[size_t(buf.tier)] -= buf.arena_bytes;
    }
    ++finished_;
    if (e_.publish_progress) e_.publish_progress(++e_.completions);
    for (int n : t_.succ[size_t(s.id)])
      if (--pending_[size_t(n)] == 0) ready_.push(n);
  }

  bool stuck() {
    const std::uint64_t sig = progress_signature(e_, finished_);
    const double at = now();
    if (sig != signature_) {
      signature_ = sig;
      last_change_ = at;
      return false;
    }
    double expected = 0;
    for (int id : inflight_) expected = std::max(expected, t_.expected_s[size_t(id)]);
    const double limit = std::max(e_.o.stall_timeout_s, 20 * expected);
    if (at - last_change_ <= limit) return false;
    std::string what;
    for (int id : inflight_) {
      const Step& s = steps_[size_t(id)];
      const char* res = step_resource(s);
      what += (what.empty() ? "" : "; ") + describe(s) + group_words(e_, s) + " on " + (*res ? res : "no resource") + ", in flight " +
              format_sig(at - times_[size_t(id)].start_s, 3) + " s, expected " + format_sig(t_.expected_s[size_t(id)], 3) + " s";
    }
    error_ = "stuck: nothing completed on any lane or rank for " + format_sig(at - last_change_, 3) + " s (limit " +
             format_sig(limit, 3) + " s); waiting on " + what;
    if (e_.describe_peers) error_ += "; " + e_.describe_peers();
    stuck_ = true;
    return true;
  }

  // After an error: let what is in flight finish so no buffer is written after we return, and give
  // its events back to the pool.
  void drain() {
    // Stuck with collectives in flight: the rank they wait for may never come, and the job is on
    // its way to MPI_Abort; waiting for them would hang here instead.
    if (stuck_)
      for (int id : inflight_)
        if (tok_[size_t(id)].kind == Token::collective)
          for (std::unique_ptr<CollectiveOp>& op : tok_[size_t(id)].ops)
            if (op) op->abandon();
    e_.k().synchronize(e_.cx());
    if (io::IoEngine* io = e_.tiers.io()) (void)io->wait_all();
    for (int id : inflight_) {
      Token& t = tok_[size_t(id)];
      if (t.kind == Token::host)
        while (!t.task->done.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (t.kind == Token::event && t.ev) e_.event_pool.push_back(t.ev);
      t.ev = nullptr;
    }
  }

  EngineContext& e_;
  const DispatchTables& t_;
  const std::vector<Step>& steps_;
  std::vector<StepTime>& times_;
  std::vector<int> pending_;
  std::vector<Token> tok_;
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready_;
  std::vector<int> parked_, inflight_;
  std::size_t finished_ = 0, next_collective_ = 0;
  int next_serial_ = 0;
  std::string error_;
  bool stuck_ = false;
  const Clock::time_point t0_ = Clock::now();
  std::uint64_t signature_ = ~std::uint64_t(0);
  double last_change_ = 0;
};

}  // namespace

DispatchTables dispatch_tables(const Schedule& s, const HardwareProfile& p) {
  DispatchTables t;
  t.succ.resize(s.steps.size());
  t.waits.assign(s.steps.size(), 0);
  t.expected_s.assign(s.steps.size(), 0);
  for (const Step& st : s.steps) {
    for (int d : st.deps) t.succ[size_t(d)].push_back(st.id);
    t.waits[size_t(st.id)] = int(st.deps.size());
    if (is_collective(st)) t.collectives.push_back(st.id);
    t.expected_s[size_t(st.id)] = expected_time(st, p, s.model.hidden);
  }
  return t;
}

Result<bool> run_schedule(EngineContext& e, const DispatchTables& t, std::vector<StepTime>& times) {
  return Loop(e, t, times).run();
}

}  // namespace memwall::exec
