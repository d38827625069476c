// The pread/pwrite engine: queue_depth threads each run one blocking call at a time, so at most
// queue_depth blocks are in flight, as with the uring engine. Same splitting, retries and errors
// (IoEngine::on_result), so the two engines are interchangeable and comparable.
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "exec/io/engine_detail.hpp"

namespace memwall::io::detail {
namespace {

class PsyncEngine final : public IoEngine {
 public:
  // Throws std::system_error when the system refuses a thread, after joining the ones started.
  explicit PsyncEngine(const EngineOptions& o) : IoEngine(o) {
    try {
      for (unsigned i = 0; i < o.queue_depth; ++i) threads_.emplace_back([this] { run(); });
    } catch (...) {
      stop_threads();
      throw;
    }
  }

  ~PsyncEngine() override { stop_threads(); }

  EngineKind kind() const override { return EngineKind::psync; }

 protected:
  void enqueue(std::vector<Chunk*>& chunks) override {
    {
      std::lock_guard lock(m_);
      queue_.insert(queue_.end(), chunks.begin(), chunks.end());
    }
    cv_.notify_all();
  }

 private:
  void stop_threads() {
    {
      std::lock_guard lock(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  void run() {
    for (;;) {
      Chunk* c;
      {
        std::unique_lock lock(m_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop_ and drained
        c = queue_.front();
        queue_.pop_front();
      }
      long res;
      Outcome o;
      do {
        char* p = c->buf + c->done;
        std::size_t n = c->length - c->done;
        auto off = static_cast<off_t>(c->offset + c->done);
        ssize_t r = c->op == IoOp::read ? ::pread(c->file->fd, p, n, off) : ::pwrite(c->file->fd, p, n, off);
        res = r < 0 ? -errno : r;
      } while ((o = on_result(c, res)) == Outcome::again);
      if (o == Outcome::transferred) complete(c);
    }
  }

  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Chunk*> queue_;  // guarded by m_
  bool stop_ = false;         // guarded by m_
  std::vector<std::thread> threads_;
};

}  // namespace

std::unique_ptr<IoEngine> make_psync_engine(const EngineOptions& options) {
  return std::make_unique<PsyncEngine>(options);
}

}  // namespace memwall::io::detail
