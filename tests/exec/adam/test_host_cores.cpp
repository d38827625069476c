// host_cores against the kernel's own accounting: the affinity mask (narrowed by the test), a
// child process that spins (seen as another process's load, named with its pid), this process's
// own spinning thread (counted as its own, never as another's), and the fit arithmetic. CpuAdam's
// cap on its threads gives the same bits at every setting.
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "exec/adam/cpu_adam.hpp"
#include "exec/adam/host_cores.hpp"

namespace memwall::adam {
namespace {

TEST(HostCores, AllowedCoresAreTheAffinityMask) {
  cpu_set_t all;
  ASSERT_EQ(sched_getaffinity(0, sizeof all, &all), 0);
  const CoresAllowed c = cores_allowed();
  EXPECT_EQ(c.cpus, CPU_COUNT(&all));
  EXPECT_EQ(int(c.cpu_ids.size()), c.cpus);
  EXPECT_GE(c.quota_cores, 1);
  EXPECT_LE(c.quota_cores, c.cpus);
  // narrowed to one CPU (this thread's mask, which sched_getaffinity(0) reads), then restored
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(c.cpu_ids.back(), &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const CoresAllowed narrowed = cores_allowed();
  ASSERT_EQ(sched_setaffinity(0, sizeof all, &all), 0);
  EXPECT_EQ(narrowed.cpus, 1);
  EXPECT_EQ(narrowed.quota_cores, 1);
  EXPECT_EQ(narrowed.cpu_ids, std::vector<int>{c.cpu_ids.back()});
}

TEST(HostCores, FitArithmetic) {
  CpuSample a, b;
  a.cpus = b.cpus = 4;
  a.wall_s = 10, b.wall_s = 12;
  a.busy_s = 100, b.busy_s = 105;  // 2.5 cores busy over 2 s
  a.self_s = 7, b.self_s = 8;      // 0.5 of them this process's
  CpuLoad l = load_between(a, b, 4);
  EXPECT_DOUBLE_EQ(l.window_s, 2);
  EXPECT_DOUBLE_EQ(l.self, 0.5);
  EXPECT_DOUBLE_EQ(l.others, 2.0);
  EXPECT_EQ(fit_threads(l), 2);
  l.others = 2.6;  // more than half a core taken: that core is gone
  EXPECT_EQ(fit_threads(l), 1);
  l.others = 2.4;
  EXPECT_EQ(fit_threads(l), 2);
  l.others = 4;
  EXPECT_EQ(fit_threads(l), 1);  // never fewer than one
  l.others = 0;
  l.quota_cores = 3;
  EXPECT_EQ(fit_threads(l), 3);  // never more than the cgroup grants
  // ticks are sampled: a difference a little outside [0, cpus] is clamped
  b.busy_s = 100.5;
  EXPECT_DOUBLE_EQ(load_between(a, b, 4).others, 0);
  EXPECT_NE(describe_load(l).find("of 4 cores busy"), std::string::npos);
}

TEST(HostCores, AnotherProcessSpinningIsSeenAndNamed) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    volatile unsigned long x = 0;
    while (std::chrono::steady_clock::now() < until) x = x + 1;
    _exit(0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Result<CpuLoad> l = measure_load(0.5);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  ASSERT_TRUE(l.ok()) << l.error();
  // the child had a core, or a fair share of one beside the other tests ctest runs at once
  EXPECT_GE(l->others, 0.3) << describe_load(*l);
  bool named = false;
  for (const BusyProcess& p : l->busiest) named = named || (p.pid == child && p.cores >= 0.3);
  // the list keeps the top three: others as busy (ctest's, stress-ng's) may outrank the child
  EXPECT_TRUE(named || l->busiest.size() == 3) << describe_load(*l);
  if (named) {
    EXPECT_NE(describe_load(*l).find("(pid " + std::to_string(child) + ")"), std::string::npos);
  }
  if (l->cpus >= 2) {
    EXPECT_LE(fit_threads(*l), l->cpus - 1) << describe_load(*l);
  }
}

TEST(HostCores, ThisProcessesOwnThreadsAreNotOthers) {
  std::atomic<bool> stop{false};
  std::thread spin([&] {
    volatile unsigned long x = 0;
    while (!stop.load(std::memory_order_relaxed)) x = x + 1;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Result<CpuLoad> l = measure_load(0.5);
  stop = true;
  spin.join();
  ASSERT_TRUE(l.ok()) << l.error();
  EXPECT_GE(l->self, 0.3);
  for (const BusyProcess& p : l->busiest) EXPECT_NE(p.pid, int(getpid()));
}

TEST(CpuAdam, ThreadsInUseAreCappedAndGiveTheSameBits) {
  const std::size_t n = 300'000;  // enough for every thread to get a range
  std::vector<float> grad(n);
  for (std::size_t i = 0; i < n; ++i) grad[i] = float(i % 97) - 48.0f;
  std::vector<std::vector<float>> results;
  CpuAdam adam = CpuAdam::create(AdamOptions{}, 3).value();
  EXPECT_EQ(adam.threads_in_use(), 3);
  for (int use : {1, 2, 3, 7, 0}) {
    adam.set_threads_in_use(use);
    EXPECT_EQ(adam.threads_in_use(), std::clamp(use, 1, 3));
    std::vector<float> p(n, 1.0f), m(n, 0.0f), v(n, 0.0f);
    AdamChunk c{p.data(), m.data(), v.data(), grad.data(), DType::fp32, nullptr, DType::bf16, n};
    ASSERT_TRUE(adam.step(c, 1).ok());
    results.push_back(p);
  }
  for (const auto& r : results) EXPECT_EQ(std::memcmp(r.data(), results[0].data(), n * sizeof(float)), 0);
}

}  // namespace
}  // namespace memwall::adam
