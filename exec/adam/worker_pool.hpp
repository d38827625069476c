// WorkerPool: a fixed set of threads that run one function on every thread and wait for all, so
// CPU Adam and the triad split a chunk without starting threads on every call.
// Owns its threads (joined in the destructor). Not a task queue: run() is called by one thread at
// a time (the owner); the function must not call run() on the same pool.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace memwall::adam {

class WorkerPool {
 public:
  // threads >= 1; threads - 1 are started, the caller is the last. Throws std::system_error when
  // the system refuses a thread (the ones already started are joined first).
  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(t) for t in [0, used) with used in [1, size()], t == 0 on the calling thread; returns
  // when every call has returned.
  void run(int used, const std::function<void(int)>& fn);

 private:
  void stop_all();
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* fn_ = nullptr;
  std::uint64_t generation_ = 0;
  int used_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace memwall::adam
