// Replay: runs the schedules of model/ on the SimGrid platform of sim/platform.hpp and reports
// iteration time, TFLOPS per GPU, efficiency against the achievable peak, busy fraction per
// resource class and peak bytes per tier, plus a Chrome trace. Every step becomes SimGrid
// activities (Exec on a GPU or CPU host, Comm over links, Io on the NVMe disk) linked by the
// schedule's dependencies, so overlap and contention come out of SimGrid's max-min sharing.
// Collectives are the flows they cause (NVSwitch inside a node, the node's NICs across nodes).
// Data-parallel ranks on other nodes are identical, so one node is built and the rest of the
// cluster is a fabric host behind each NIC: exact when every node runs the same schedule.
// SimGrid allows one engine per process: call simulate() once per process.
#pragma once

#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/schedule.hpp"
#include "model/timeline.hpp"

namespace memwall::sim {

struct SimOptions {
  bool overlap = true;           // false: every step of a rank waits for the one before it
  bool trace = false;            // collect Chrome trace events
  double gpu_hbm_Bps = 900e9;    // optimizer on GPU is HBM-bound: 32 B per parameter (V100: 900 GB/s)
};

using TraceEvent = memwall::TraceEvent;  // model/timeline.hpp: the executor writes the same events

struct SimReport {
  std::string strategy;
  double iteration_s = 0;
  double tflops_per_gpu = 0;
  double efficiency = 0;           // achieved / achievable peak
  double peak_flops_per_s = 0;
  int gpus = 0, dp = 1, mp = 1;
  int ranks_simulated = 0, nodes_simulated = 0;
  long activities = 0;
  std::map<std::string, double> busy_fraction;  // gpu_compute, pcie, nvme, nvlink, network, cpu
  std::array<double, kTiers> peak_bytes{};
  std::optional<Overflow> overflow;             // set: the schedule does not fit, nothing simulated
  std::map<std::string, double> phase_end_s;    // "fwd", "bwd" (recompute included), "optim"
  std::vector<TraceEvent> trace;

  double backward_s() const;  // from the end of forward to the end of backward
};

Result<SimReport> simulate(const ModelSpec& model, const Placement& placement, const TrainingConfig& config,
                           const HardwareProfile& profile, const SimOptions& options);

// The same in a forked child process, so one process can run many simulations (SimGrid keeps one
// engine per process). The trace comes back when options.trace asks for it (as JSON over the pipe:
// large for paper-sized models), otherwise it stays empty.
Result<SimReport> simulate_isolated(const ModelSpec& model, const Placement& placement, const TrainingConfig& config,
                                    const HardwareProfile& profile, const SimOptions& options);

// The trace as Chrome trace-event JSON (opens in Perfetto / chrome://tracing).
std::string chrome_trace_json(const SimReport& report);

}  // namespace memwall::sim
