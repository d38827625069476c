#include "exec/adam/host_cores.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#if defined(__linux__)
#include <dirent.h>
#include <sched.h>
#include <unistd.h>
#endif

namespace memwall::adam {
namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string read_small(const std::string& path) {
  std::ifstream f(path);
  if (!f) return {};
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

double tick_s() {
#if defined(__linux__)
  const long hz = sysconf(_SC_CLK_TCK);
  return 1.0 / double(hz > 0 ? hz : 100);
#else
  return 0.01;
#endif
}

// utime + stime of /proc/PID/stat's text, in ticks; the name is field 2 in parentheses and may hold
// spaces or parentheses itself, so fields are counted from the last ')'.
bool parse_stat_times(const std::string& text, double& ticks, std::string* name) {
  const std::size_t open = text.find('('), close = text.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return false;
  if (name) {
    *name = text.substr(open + 1, close - open - 1);
    for (char& c : *name)  // a process names itself: keep what we print on one line
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  std::istringstream in(text.substr(close + 1));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {  // field 3 is the state
    if (i == 14) utime = std::strtod(field.c_str(), nullptr);
    if (i == 15) stime = std::strtod(field.c_str(), nullptr);
  }
  if (!in) return false;
  ticks = utime + stime;
  return true;
}

// The cgroup v2 quota of this process's group and its parents, in cores (0: none).
double cgroup_quota_cores() {
  const std::string groups = read_small("/proc/self/cgroup");
  const std::size_t at = groups.find("0::");
  if (at == std::string::npos) return 0;
  std::string path = groups.substr(at + 3);
  path = path.substr(0, path.find('\n'));
  double best = 0;
  for (;;) {
    std::istringstream in(read_small("/sys/fs/cgroup" + path + "/cpu.max"));
    std::string quota;
    double period = 0;
    if (in >> quota >> period && quota != "max" && period > 0) {
      const double cores = std::strtod(quota.c_str(), nullptr) / period;
      if (cores > 0 && (best == 0 || cores < best)) best = cores;
    }
    if (path.empty() || path == "/") break;
    const std::size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  return best;
}

// pid -> (name, CPU seconds) of every process but this one.
std::map<int, std::pair<std::string, double>> process_times() {
  std::map<int, std::pair<std::string, double>> out;
#if defined(__linux__)
  DIR* d = opendir("/proc");
  if (!d) return out;
  const int self = int(getpid());
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long pid = std::strtol(e->d_name, &end, 10);
    if (!end || *end != '\0' || pid <= 0 || pid == self) continue;
    double ticks = 0;
    std::string name;
    if (parse_stat_times(read_small("/proc/" + std::string(e->d_name) + "/stat"), ticks, &name))
      out[int(pid)] = {name, ticks * tick_s()};
  }
  closedir(d);
#endif
  return out;
}

std::string fmt1(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

}  // namespace

CoresAllowed cores_allowed() {
  CoresAllowed c;
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int i = 0; i < CPU_SETSIZE; ++i)
      if (CPU_ISSET(i, &set)) c.cpu_ids.push_back(i);
  }
  if (c.cpu_ids.empty()) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (int i = 0; i < std::max(1L, n); ++i) c.cpu_ids.push_back(i);
  }
#else
  c.cpu_ids = {0};
#endif
  c.cpus = int(c.cpu_ids.size());
  const double quota = cgroup_quota_cores();
  c.quota_cores = quota > 0 ? std::min(c.cpus, std::max(1, int(std::ceil(quota - 1e-9)))) : c.cpus;
  return c;
}

std::vector<int> sharing_cpus(const std::vector<int>& pids, const CoresAllowed& allowed) {
  std::vector<int> out;
#if defined(__linux__)
  for (int pid : pids) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(pid_t(pid), sizeof set, &set) != 0) continue;  // gone, or not ours to ask
    for (int cpu : allowed.cpu_ids)
      if (CPU_ISSET(cpu, &set)) {
        out.push_back(pid);
        break;
      }
  }
#endif
  return out;
}

Result<CpuSample> sample_cpu(const CoresAllowed& allowed, const std::vector<int>& job_peers) {
  CpuSample s;
  s.cpus = allowed.cpus;
  s.job_processes = 1 + int(job_peers.size());
  s.wall_s = now_s();
#if defined(__linux__)
  const double tick = tick_s();
  std::istringstream stat(read_small("/proc/stat"));
  if (!stat) return make_error("/proc/stat: cannot read it");
  std::string line;
  int seen = 0;
  while (std::getline(stat, line)) {
    if (line.rfind("cpu", 0) != 0 || line.size() < 4 || line[3] < '0' || line[3] > '9') continue;
    std::istringstream in(line.substr(3));
    int id = -1;
    double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    in >> id >> user >> nice >> system >> idle >> iowait >> irq >> softirq;
    if (!in) return make_error("/proc/stat: cannot read the line \"" + line + "\"");
    in >> steal;  // absent on old kernels
    if (!std::binary_search(allowed.cpu_ids.begin(), allowed.cpu_ids.end(), id)) continue;
    // irq and softirq are the kernel's, charged to whichever CPU took them (this job's I/O among
    // them), not another program's
    s.busy_s += (user + nice + system + steal) * tick;
    ++seen;
  }
  if (seen == 0) return make_error("/proc/stat: none of this process's CPUs is listed");
  double ticks = 0;
  if (!parse_stat_times(read_small("/proc/self/stat"), ticks, nullptr))
    return make_error("/proc/self/stat: cannot read this process's CPU time");
  s.self_s = ticks * tick;
  for (int pid : job_peers)  // a peer that exited counts nothing from then on
    if (parse_stat_times(read_small("/proc/" + std::to_string(pid) + "/stat"), ticks, nullptr)) s.peers_s += ticks * tick;
#endif
  return s;
}

CpuLoad load_between(const CpuSample& a, const CpuSample& b, int quota_cores) {
  CpuLoad l;
  l.cpus = b.cpus;
  l.quota_cores = quota_cores;
  l.job_processes = b.job_processes;
  l.window_s = std::max(0.0, b.wall_s - a.wall_s);
  if (l.window_s > 0) {
    l.self = std::max(0.0, b.self_s - a.self_s) / l.window_s;
    const double peers = std::max(0.0, b.peers_s - a.peers_s) / l.window_s;
    // ticks are sampled, so the difference can come out a little below zero or above the CPUs
    l.others = std::clamp((b.busy_s - a.busy_s) / l.window_s - l.self - peers, 0.0, double(l.cpus));
  }
  return l;
}

Result<LoadWindow> begin_load_window(const std::vector<int>& job_pids) {
  LoadWindow w;
  w.allowed = cores_allowed();
  w.job_peers = sharing_cpus(job_pids, w.allowed);
  w.others = process_times();
  for (int pid : job_pids) w.others.erase(pid);
  Result<CpuSample> a = sample_cpu(w.allowed, w.job_peers);
  if (!a) return make_error(a.error());
  w.start = *a;
  return w;
}

Result<CpuLoad> end_load_window(const LoadWindow& w, double min_window_s) {
  const double left = w.start.wall_s + min_window_s - now_s();
  if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
  Result<CpuSample> b = sample_cpu(w.allowed, w.job_peers);
  if (!b) return make_error(b.error());
  const auto after = process_times();  // the peers were left out at the start
  CpuLoad l = load_between(w.start, *b, w.allowed.quota_cores);
  for (const auto& [pid, now] : after) {
    auto was = w.others.find(pid);
    if (was == w.others.end() || l.window_s <= 0) continue;
    const double cores = (now.second - was->second.second) / l.window_s;
    if (cores >= 0.05) l.busiest.push_back({pid, now.first, cores});
  }
  std::sort(l.busiest.begin(), l.busiest.end(), [](const BusyProcess& x, const BusyProcess& y) {
    return x.cores != y.cores ? x.cores > y.cores : x.pid < y.pid;
  });
  if (l.busiest.size() > 3) l.busiest.resize(3);
  return l;
}

Result<CpuLoad> measure_load(double window_s) {
  Result<LoadWindow> w = begin_load_window();
  if (!w) return make_error(w.error());
  return end_load_window(*w, window_s);
}

int fit_threads(const CpuLoad& load) {
  const int n = std::max(1, load.job_processes);
  const int free_cores = int(std::floor(double(load.cpus) - load.others + 0.5));
  return std::max(1, std::min(load.quota_cores / n, free_cores / n));
}

std::string describe_load(const CpuLoad& load) {
  std::string s = "other processes kept " + fmt1(load.others) + " of " + std::to_string(load.cpus) +
                  (load.cpus == 1 ? " core" : " cores") + " busy";
  if (load.quota_cores < load.cpus) s += " (this process's cgroup may use " + std::to_string(load.quota_cores) + ")";
  if (load.job_processes > 1) s += ", the rest shared by this node's " + std::to_string(load.job_processes) + " ranks";
  if (!load.busiest.empty()) {
    s += ": ";
    for (std::size_t i = 0; i < load.busiest.size(); ++i)
      s += (i ? ", " : "") + load.busiest[i].name + " (pid " + std::to_string(load.busiest[i].pid) + ") " +
           fmt1(load.busiest[i].cores);
  }
  return s;
}

}  // namespace memwall::adam
