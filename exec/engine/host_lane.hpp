// HostLane: host work beside the engine's dispatcher (CPU Adam on a chunk, widening gradients),
// one task at a time in the order posted, on a thread of its own. The dispatcher posts and polls;
// nothing here blocks it. `progress()` counts the pieces of work tasks report done, so a long task
// on a busy machine is seen moving (exec/engine/dispatcher.hpp's watchdog).
// Thread-safety: post/progress from the dispatcher; tasks run on the lane's thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

namespace memwall::exec {

struct HostTask {
  std::atomic<bool> done{false};
  std::string error;  // empty: it succeeded
};

class HostLane {
 public:
  HostLane();
  ~HostLane();  // finishes the queued tasks, then joins
  HostLane(const HostLane&) = delete;
  HostLane& operator=(const HostLane&) = delete;

  // `fn` returns an error message, or "" when it succeeded.
  std::shared_ptr<HostTask> post(std::function<std::string()> fn);
  // Tasks call this as they finish a piece of work.
  void report_progress() { progress_.fetch_add(1, std::memory_order_relaxed); }
  std::uint64_t progress() const { return progress_.load(std::memory_order_relaxed); }

 private:
  void loop();
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::pair<std::shared_ptr<HostTask>, std::function<std::string()>>> q_;
  bool stop_ = false;
  std::atomic<std::uint64_t> progress_{0};
  std::thread thread_;
};

}  // namespace memwall::exec
