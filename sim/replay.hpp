// Replay: runs the schedules of model/ on the SimGrid platform of sim/platform.hpp and reports
// iteration time, TFLOPS per GPU, efficiency against the achievable peak, how busy each resource
// class was and peak bytes per tier, plus a Chrome trace. Every step becomes SimGrid activities
// (an Exec on a GPU, or flows over the links it crosses: PCIe, PCIe root, DRAM, NVMe, the CPU
// cores running Adam, NVLink, NICs) linked by the schedule's dependencies, so overlap and
// contention come out of SimGrid's max-min sharing. Operators cost max(FLOPs / peak, activation
// bytes / HBM bandwidth); collectives are NCCL's algorithms as flows (sim/collectives.hpp).
// Two ways to replay:
//   full       every GPU of dp x mp with its own schedule, on every node used; a collective starts
//              when all its members have reached it (so a non-owner's broadcast waits for the
//              owner's fetch) and runs its algorithm's flows step by step. Always used for the
//              broadcast variant (ZeRO-Offload), whose ranks differ, and for pipeline stages
//              (config.pp) that do not tile the nodes. A stage's send and its peer's receive (the next
//              stage's, or interleaved, the first stage's from the last and back)
//              meet as one flow between their GPUs.
//   symmetric  bandwidth-centric partitioning makes every GPU run the same steps at the same time,
//              so one GPU is replayed with 1/g of each resource its node's g busy GPUs share, and
//              stand-in hosts send and receive the other members' halves of each collective. With
//              pipeline stages, one GPU per stage stands for its stage's dp x mp GPUs (when the
//              stages tile the nodes: each of whole nodes, or several to a node), its node's
//              resources shared by as many, and its sends and receives meet its neighbour's as flows.
//              tests/sim/test_ground_truth.cpp holds both to the full replay within 1 %.
// SimGrid allows one engine per process: call simulate() once per process (or simulate_isolated).
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/schedule.hpp"
#include "model/timeline.hpp"
#include "sim/collectives.hpp"

namespace memwall::sim {

struct SimOptions {
  bool overlap = true;  // false: every step of a rank waits for the one before it
  bool trace = false;   // collect Chrome trace events
  bool full = false;    // replay every GPU even when the ranks are symmetric (the ground truth; slower)
  // A group's collectives on a rank run one at a time, in the order the rank issues them: one NCCL
  // stream per communicator, as memwall's executor runs them (exec/engine/collectives_nccl.cpp) and
  // as PyTorch's ProcessGroupNCCL does (one stream per device and process group, which DeepSpeed's
  // all-gathers and reduce-scatters share). false: every collective whose dependencies allow runs at
  // once, the concurrent ones sharing the links (a what-if). Pipeline sends and receives are posted
  // as their own dependencies allow either way.
  bool one_stream = true;
  // Called every progress_interval_s of wall time at most (checked every 256 activities) while
  // SimGrid runs (long replays, --full on many nodes): activities done, activities in all, and the
  // simulated time reached. Once with (0, 0, 0) first, when the job has passed every check and the
  // replay is being built. On the thread that called simulate (simulate_isolated: in its child).
  std::function<void(std::size_t done, std::size_t total, double simulated_s)> progress;
  double progress_interval_s = 1.0;
  // The bytes the schedule counts (model/schedule.hpp): the paper's by default; an executor's
  // (exec::executor_sizes) to replay exactly the schedule `memwall run` executes.
  std::optional<MemorySizes> sizes;
};

// The full replay builds a route between every two GPUs: more than this many GPUs is refused.
inline constexpr int kMaxFullReplayGpus = 256;

using TraceEvent = memwall::TraceEvent;  // model/timeline.hpp: the executor writes the same events

struct SimReport {
  std::string strategy;
  double iteration_s = 0;
  double tflops_per_gpu = 0;
  double efficiency = 0;           // achieved / achievable peak
  double peak_flops_per_s = 0;
  int gpus = 0, dp = 1, mp = 1, pp = 1, virtual_stages = 1;
  int ranks_simulated = 0, nodes_simulated = 0;  // GPUs and nodes replayed
  bool full = false;                             // every GPU replayed (else one with its share)
  long activities = 0;
  // Per resource class (gpu_compute, pcie, pcie_root, nvlink, network, dram, nvme, cpu): the work
  // it did over the iteration / (its capacity x iteration_s), for its busiest instance: bytes over
  // a link (one direction of a duplex one), FLOP-equivalents on a GPU. 1 = saturated throughout.
  std::map<std::string, double> busy_fraction;
  std::array<double, kTiers> peak_bytes{};
  std::optional<Overflow> overflow;             // set: the schedule does not fit, nothing simulated
  std::map<std::string, double> phase_end_s;    // "fwd", "bwd" (recompute included), "optim"
  std::vector<TraceEvent> trace;

  double backward_s() const;  // from the end of forward to the end of backward
};

// Replays the schedules as built (build_schedules: one per rank of the broadcast variant, one per
// pipeline stage, else one); their model, placement and config are the job's. options.sizes is
// not used: the schedules carry theirs.
Result<SimReport> simulate(const std::vector<const Schedule*>& schedules, const HardwareProfile& profile,
                           const SimOptions& options);
// Builds the schedules (with options.sizes) and replays them.
Result<SimReport> simulate(const ModelSpec& model, const Placement& placement, const TrainingConfig& config,
                           const HardwareProfile& profile, const SimOptions& options);

// The same in a forked child process, so one process can run many simulations (SimGrid keeps one
// engine per process). The trace comes back when options.trace asks for it (as JSON over the pipe:
// large for paper-sized models), otherwise it stays empty.
Result<SimReport> simulate_isolated(const ModelSpec& model, const Placement& placement, const TrainingConfig& config,
                                    const HardwareProfile& profile, const SimOptions& options);

// One plan's simulated iteration for a planner's re-ranking (`plan --simulate-top`, the GUI's Plan
// tab), replayed in a child process (simulate_isolated) with `sizes` (an executor's, where one runs
// the profile; else the paper's); or why there is none: the broadcast fetch (not rank-symmetric:
// every rank of a node replayed, too slow for a planning loop), a replay that failed, or a schedule
// that overflows a tier (its message).
struct RankingReplay {
  std::optional<double> iteration_s;
  std::string why_not;
};
RankingReplay replay_for_ranking(const ModelSpec& model, const Placement& placement, const TrainingConfig& config,
                                 const HardwareProfile& profile, std::optional<MemorySizes> sizes = std::nullopt);

// One collective alone on idle links of `profile` (its members' GPUs the only busy ones in their
// nodes), with the algorithm NCCL would pick: every member's flows (`full`) or one member's with
// stand-ins, as simulate() lays them out. Its duration, for the tests against closed_form_s. Runs
// in a forked child, as simulate_isolated.
Result<double> simulate_collective(const HardwareProfile& profile, const CollectiveOp& op, bool full);

// The report as JSON, the one writer of it (`memwall simulate --json`, the simulation child's
// answer): every field by its name, the overflow as {tier, step, needed_bytes, capacity_bytes,
// message}, the trace's events when `with_trace` (large for paper-sized models).
nlohmann::ordered_json to_json(const SimReport& report, bool with_trace = false);

// The trace as Chrome trace-event JSON (opens in Perfetto / chrome://tracing).
std::string chrome_trace_json(const SimReport& report);

}  // namespace memwall::sim
