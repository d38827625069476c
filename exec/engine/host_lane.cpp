#include "exec/engine/host_lane.hpp"

namespace memwall::exec {

HostLane::HostLane() : thread_([this] { loop(); }) {}

HostLane::~HostLane() {
  {
    std::lock_guard lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<HostTask> HostLane::post(std::function<std::string()> fn) {
  auto t = std::make_shared<HostTask>();
  {
    std::lock_guard lock(m_);
    q_.push_back({t, std::move(fn)});
  }
  cv_.notify_all();
  return t;
}

void HostLane::loop() {
  std::unique_lock lock(m_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !q_.empty(); });
    if (q_.empty()) return;
    auto [task, fn] = std::move(q_.front());
    q_.pop_front();
    lock.unlock();
    std::string e = fn();
    task->error = std::move(e);
    report_progress();
    task->done.store(true, std::memory_order_release);
    lock.lock();
  }
}

}  // namespace memwall::exec
