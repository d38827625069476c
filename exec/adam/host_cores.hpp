// host_cores: how many threads memwall's CPU work (OpenBLAS, the backend's OpenMP loops, CPU Adam)
// should use on a machine it may share. A thread more than there are cores free for it does not
// add work done: it waits for a core, and every barrier the others reach waits for it (measured on
// 2 cores with stress-ng --cpu 4 beside a run: 1001 ms per step with two OpenMP threads, 153 ms
// with one).
//
//   cores_allowed()   the CPUs of this process's affinity mask, capped by a cgroup v2 CPU quota
//   sample_cpu()      CPU time so far on those CPUs (/proc/stat), and this process's own
//                     (/proc/self/stat): two samples give what other processes kept busy
//   measure_load(s)   two samples s seconds apart, with the busiest other processes (or a
//                     begin/end_load_window around work of this process's own)
//   fit_threads(load) the cores the others left free: max(1, min(quota, cores - others))
//
// Time is counted in the kernel's clock ticks (USER_HZ, 10 ms), so a window shorter than ~50 ms
// says little. Linux only; elsewhere every call reports one core and no load.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "model/result.hpp"

namespace memwall::adam {

// The CPUs this process may run on (sched_getaffinity) and the cgroup v2 quota (cpu.max) in cores,
// rounded up; quota_cores == cpus when there is none.
struct CoresAllowed {
  int cpus = 1;
  int quota_cores = 1;
  std::vector<int> cpu_ids;  // the mask's CPUs
};
CoresAllowed cores_allowed();

// Those of `pids` (the job's other processes on this node) allowed on any of this process's CPUs:
// the ones that share its cores (mpirun binds each rank to its own core unless told otherwise).
std::vector<int> sharing_cpus(const std::vector<int>& pids, const CoresAllowed& allowed);

// CPU time on the allowed CPUs since boot, in seconds: busy (user, nice, system, steal) summed over
// them, this process's user + system time (all its threads), and that of the job's other processes
// on this node (mpirun's ranks: their time is the job's, not another program's).
struct CpuSample {
  double wall_s = 0;   // steady clock
  double busy_s = 0;   // the allowed CPUs' busy time
  double self_s = 0;   // this process's
  double peers_s = 0;  // the job's other processes'
  int cpus = 1;
  int job_processes = 1;  // this one and its peers
};
Result<CpuSample> sample_cpu(const CoresAllowed& allowed, const std::vector<int>& job_peers = {});

struct BusyProcess {
  int pid = 0;
  std::string name;    // /proc/PID/comm
  double cores = 0;    // CPU time / wall time over the window
};

// What the other processes did between two samples.
struct CpuLoad {
  int cpus = 1;             // allowed CPUs
  int quota_cores = 1;
  int job_processes = 1;    // this process and the job's others on this node, sharing what is free
  double others = 0;        // cores' worth kept busy by other programs (>= 0), the job's not counted
  double self = 0;          // cores' worth this process used
  double window_s = 0;
  std::vector<BusyProcess> busiest;  // measure_load only: the top three others, busiest first
};
CpuLoad load_between(const CpuSample& before, const CpuSample& after, int quota_cores);

// A window over which the load is measured while this process does its own work (its own time is
// not the others'): begin, work, end. end sleeps what is left of min_window_s, then lists the
// busiest other processes seen over the window.
struct LoadWindow {
  CoresAllowed allowed;
  std::vector<int> job_peers;  // the job's processes that share this one's CPUs (sharing_cpus)
  CpuSample start;
  std::map<int, std::pair<std::string, double>> others;  // pid -> (name, CPU seconds) at start
};
// job_pids: the job's other processes on this node, never listed as others
Result<LoadWindow> begin_load_window(const std::vector<int>& job_pids = {});
Result<CpuLoad> end_load_window(const LoadWindow& window, double min_window_s);
// begin, sleep window_s, end
Result<CpuLoad> measure_load(double window_s);

// Threads that fit: the cores other programs left, shared by the job's processes on this node, at
// least 1, at most the quota's share. Half a core's worth of others' work rounds to a core taken.
int fit_threads(const CpuLoad& load);

// Other programs' load from which a measurement is called a busy machine's (calibrate refuses it,
// validate warns), in cores.
constexpr double kBusyCores = 0.5;

// "other processes kept 1.9 of 2 cores busy (stress-ng-cpu pid 812 1.0, ...)"
std::string describe_load(const CpuLoad& load);

}  // namespace memwall::adam
