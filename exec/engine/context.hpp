// EngineContext: what the handlers (exec/engine/handlers.hpp) and the dispatcher
// (exec/engine/dispatcher.hpp) share while a schedule runs: the options, the rank's schedules as
// they were built, the backend and its copy streams, the GPT's operators, the tiers, collectives,
// CPU Adam and its host lane, and the counters one iteration fills. Engine (engine.hpp) owns one.
// Thread-safety: the dispatcher's thread; the host lane runs tasks the handlers post.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "exec/adam/cpu_adam.hpp"
#include "exec/backend/backend.hpp"
#include "exec/engine/collectives.hpp"
#include "exec/engine/engine.hpp"
#include "exec/engine/host_lane.hpp"
#include "exec/engine/tiers.hpp"
#include "exec/gpt/gpt.hpp"

namespace memwall::exec {

// What the loop needs of a schedule, made once per schedule.
struct DispatchTables {
  std::vector<std::vector<int>> succ;  // per step: the steps that depend on it
  std::vector<int> waits;              // per step: how many steps it depends on
  std::vector<int> collectives;        // the collective steps, in schedule order
  std::vector<double> expected_s;      // per step: its time on idle resources of the profile
};
struct EngineContext {
  EngineOptions o;  // normalised (plan_rank): dp the job's ranks, seq the model's, ...
  int rank = 0, dp = 1;  // this rank's data-parallel rank and group size
  // Tensor slicing: this rank's place in its mp group, and in the job (an mp group is mp
  // consecutive ranks, as Megatron-LM lays them out).
  int mp = 1, mp_rank = 0, world_rank = 0, world = 1;
  int pp = 1, stage = 0;  // pipeline stages and this rank's (world rank (stage x dp + rank) x mp + mp_rank)
  // The world rank of stage `st`, data-parallel rank `d`, slice `m`: the stages outermost, then dp,
  // then mp (Megatron-LM's order; the one place it is written).
  int world_rank_of(int st, int d, int m) const { return (st * dp + d) * mp + m; }
  GptConfig slice;  // the model as this rank holds and computes it: mp_slice(o.model, mp, mp_rank)
  RankPlan plan;
  const Schedule* sched = nullptr;  // the schedule this iteration runs: plan.schedule, or plan.warmup
  const DispatchTables* tables = nullptr;  // sched's
  DispatchTables main_tables, warmup_tables;
  std::unique_ptr<Backend> be;
  Stream h2d = 0, d2h = 0;
  Tiers tiers;
  std::unique_ptr<GptOps> gpt;
  std::unique_ptr<Collectives> coll;  // the dp group, dp > 1: MPI (cpu) or NCCL (cuda)
  std::unique_ptr<Collectives> boot;  // the MPI collectives NCCL was bootstrapped over
  std::unique_ptr<Collectives> mp_coll, mp_boot;  // the mp group, mp > 1: the same two
  std::unique_ptr<Collectives> pp_coll, pp_boot;  // the pp group (this dp and mp rank's stages), pp > 1
  // the tied group (this dp and mp rank's first and last stage), a tied embedding with pp > 1, on those stages
  std::unique_ptr<Collectives> tied_coll, tied_boot;
  std::unique_ptr<Collectives> world_coll;  // every rank of the job, mp or pp > 1 (MPI)
  std::unique_ptr<adam::CpuAdam> adam;
  std::unique_ptr<HostLane> lane;
  // host threads (options.threads): fitted to the load when `fitted`, from `looked` on
  struct HostThreads {
    bool fitted = false;
    adam::CoresAllowed allowed;
    std::vector<int> job_peers;  // this node's other ranks
    adam::CpuSample looked;
    adam::CpuLoad load;
    int threads = 1;
  } host;
  long adam_step = 0;
  int iteration = 0;
  bool dpu_active = false;  // dpu: the delayed update's schedule runs
  bool skip_update = false; // its first iteration has no pending gradients: the updates only copy
  std::vector<Event> event_pool;
  std::vector<float> grads_kept;  // options.keep_gradients: the optimizer slices' order
  // Gradient clipping (TrainingConfig::grad_clip): the sums of squares behind the global norm, the
  // norm of the iteration's gradients and the coefficient the next updates apply (1: no clipping;
  // dpu's delayed update applies the one of the gradients it applies, taken an iteration earlier).
  struct Norm {
    std::vector<double> units;     // grad16 on nvme: per unit, this rank's part as its final value was written
    std::vector<double> partials;  // grad16 on the device: per unit, sum_squares' parts
    int parts = 1;                 // sum_squares' parts per unit (its scratch: the fp32 grad staging)
    double mine = 0;               // this rank's optimizer partition
    std::array<float, 2> words{};  // `mine` as two fp32 words (the float, and the float of the rest)
    std::vector<float> all;        // every rank's two words, after the exchange
    double global = std::numeric_limits<double>::quiet_NaN();  // the iteration's norm (NaN: none yet)
    double clip_coef = 1.0;
  } norm;
// this iteration's batch (micro-step, then micro-batch, then B x T) and each position's loss
  const int* batch_tokens = nullptr;
  const int* batch_targets = nullptr;
  std::vector<float> step_losses;
  // Completions on the other ranks of this node (their dispatchers count them), for the watchdog;
  // empty at dp 1 or across nodes.
  std::function<std::uint64_t()> peer_progress;
  std::function<void(std::uint64_t)> publish_progress;  // this rank's completions so far, for the others
  std::function<std::string()> describe_peers;          // stuck: the rank waited for (PeerWatch)
  std::uint64_t completions = 0;                        // over the run
  // one iteration's counters, filled by the dispatcher
  std::array<double, kLinkClasses> bytes_moved{};
  std::array<std::size_t, kTiers> live_bytes{}, live_high_water{}, extent_high_water{};

  ~EngineContext();
  const BackendOps& k() const { return be->ops(); }
  void* cx() const { return be->ctx(); }
  Tier tier(State s) const { return o.placement.of(s).tier; }
  char* buffer(int id) const { return tiers.buffer(*sched, id); }
  // Host-side calls over every rank of the job (checkpoints, checks): the world's MPI collectives,
  // or at mp 1 the dp group's; nullptr for a job of one rank.
  Collectives* everyone() const {
    if (world_coll) return world_coll.get();
    return boot ? boot.get() : coll.get();
  }
  Event take_event();
};

}  // namespace memwall::exec
