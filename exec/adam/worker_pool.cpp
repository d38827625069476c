#include "exec/adam/worker_pool.hpp"

#include <algorithm>

namespace memwall::adam {

WorkerPool::WorkerPool(int threads) {
  try {
    for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this, i] { worker_loop(i); });
  } catch (...) {  // a thread could not start (std::system_error): stop the ones that did, then report
    stop_all();
    throw;
  }
}

WorkerPool::~WorkerPool() { stop_all(); }

void WorkerPool::stop_all() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

void WorkerPool::run(int used, const std::function<void(int)>& fn) {
  used = std::clamp(used, 1, size());
  if (used > 1) {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    used_ = used;
    pending_ = used - 1;
    ++generation_;
  }
  if (used > 1) start_cv_.notify_all();
  fn(0);
  if (used > 1) {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return pending_ == 0; });
    fn_ = nullptr;
  }
}

void WorkerPool::worker_loop(int index) {
  std::uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* fn = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index < used_) fn = fn_;
    }
    if (!fn) continue;
    (*fn)(index);
    std::lock_guard<std::mutex> lock(mu_);
    if (--pending_ == 0) done_cv_.notify_one();
  }
}

}  // namespace memwall::adam
