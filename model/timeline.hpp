// Timeline: when the steps of a schedule ran, simulated (sim/) or executed (exec/), and what both
// report from it: the name and resource of each step in a trace, the Chrome trace itself, and the
// overlap metrics of results/METRICS.md (compute time, transfer time and exposed transfer time per
// link class, the fraction of transfer time hidden behind compute). One definition, so a simulated
// and an executed iteration are measured the same way and their traces open side by side.
// Pure functions over value types: thread-safe.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "model/schedule.hpp"

namespace memwall {

struct TraceEvent {
  std::string name, track;  // step_label; a resource, per GPU where it is one ("gpu0 pcie")
  double start_s = 0, end_s = 0;
  int step = 0;
  int rank = 0;             // data-parallel rank: the trace's process
};

// The trace process ids: simulate's GPUs are pid = rank; an executed run's ranks (`run --trace`,
// validate's measured.json) are pid = kExecutedTracePid + rank, so a simulated and an executed
// trace opened together (Perfetto merges the files it is given) keep their processes apart.
inline constexpr int kExecutedTracePid = 1000;

// Chrome trace-event JSON (opens in Perfetto / chrome://tracing): one process per rank named
// `process_name` (with the rank), pid `pid_base` + rank, one thread per track, step ids in each
// event's args.
std::string chrome_trace_json(const std::vector<TraceEvent>& events, const std::string& process_name,
                              int pid_base = 0);

// Reads back a trace chrome_trace_json wrote (`memwall run --trace`, `simulate --trace`, the two of
// `validate --trace-dir`): its complete events ("ph": "X"), the track from "cat", the step from
// args, the rank from "pid" (less kExecutedTracePid for an executed run's). Errors (missing file, not JSON, no traceEvents, more than 256 MiB)
// name the file.
Result<std::vector<TraceEvent>> read_chrome_trace(const std::string& path);

struct StepTime {
  int step = 0;
  double start_s = 0, end_s = 0;
};

// results/METRICS.md, "Overlap": over one iteration of `s` with the steps' times,
//   compute_s        measure of the union of compute and optimizer step intervals
//   transfer_s[c]    measure of the union of the intervals of steps moving bytes over link class c
//   exposed_s[c]     measure of transfer_s[c]'s intervals outside every compute interval
//   hidden_fraction  1 - sum(exposed_s) / sum(transfer_s)  (1 when nothing moved)
//   phase_s[p]       from the first start to the last end of the steps of phase p (forward,
//                    recompute, backward, optimizer; recompute and backward interleave)
struct OverlapReport {
  double iteration_s = 0;
  std::array<double, 4> phase_s{};  // indexed by Phase
  double compute_s = 0;
  std::array<double, kLinkClasses> transfer_s{};
  std::array<double, kLinkClasses> exposed_s{};
  double hidden_fraction = 1;
};
OverlapReport overlap_report(const Schedule& s, const std::vector<StepTime>& times);
// Field by field, the median of several iterations' reports (the steady state a run summary
// quotes: every time and the hidden fraction from the same statistic). Empty: a zero report.
OverlapReport median_overlap(const std::vector<OverlapReport>& reports);
// The iterations a summary's medians are taken over: all but the first (warm-up: first touches,
// page faults, lazy allocations) when there are more than two.
std::size_t steady_from(std::size_t iterations);

}  // namespace memwall
