// The liburing engine. Each ring has one worker thread that owns it (io_uring's submission queue
// is single-producer): callers push blocks onto the ring's queue and poke an eventfd only when the
// worker sleeps with free ring slots (a full ring refills at its next completion); the worker
// keeps up to queue_depth blocks in flight, submits everything it prepared with one
// io_uring_submit_and_wait call (batching), and sleeps in the kernel until a completion or the
// eventfd read completes, so an idle engine uses no CPU. Modelled on liburing's io_uring-cp.c and
// fio's engines/io_uring.c: short transfers are re-issued for the rest, -EAGAIN retried.
#include <liburing.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "exec/io/engine_detail.hpp"

namespace memwall::io::detail {
namespace {

class UringEngine final : public IoEngine {
 public:
  explicit UringEngine(const EngineOptions& o) : IoEngine(o) {}

  ~UringEngine() override {
    for (auto& r : rings_) {
      {
        std::lock_guard lock(r->m);
        r->stop = true;
      }
      poke(*r);
    }
    for (auto& r : rings_) {
      if (r->thread.joinable()) r->thread.join();
      io_uring_queue_exit(&r->ring);
      ::close(r->wake_fd);
    }
  }

  EngineKind kind() const override { return EngineKind::uring; }

  Status start() {
    for (unsigned i = 0; i < options().rings; ++i) {
      auto r = std::make_unique<Ring>();
      // queue_depth blocks plus the armed eventfd read.
      MEMWALL_URING_CHECK(io_uring_queue_init(options().queue_depth + 1, &r->ring, 0));
      r->wake_fd = ::eventfd(0, EFD_CLOEXEC);
      if (r->wake_fd < 0) {
        io_uring_queue_exit(&r->ring);
        return make_error(call_error("eventfd", errno, __FILE__, __LINE__));
      }
      rings_.push_back(std::move(r));
    }
    for (auto& r : rings_) r->thread = std::thread([this, ring = r.get()] { run(*ring); });
    return ok_status();
  }

  Status register_buffers(std::span<const iovec> regions) override {
    std::lock_guard lock(fixed_m_);
    if (!fixed_.empty()) return make_error("io_uring buffers are already registered on this engine");
    for (auto& r : rings_)
      MEMWALL_URING_CHECK(io_uring_register_buffers(&r->ring, regions.data(), static_cast<unsigned>(regions.size())));
    fixed_.assign(regions.begin(), regions.end());
    return ok_status();
  }

 protected:
  void enqueue(std::vector<Chunk*>& chunks) override {
    // Round-robin blocks over rings; one poke per ring per submit, not per block.
    // A worker whose ring is full needs no wake: it drains the queue after its next completion.
    std::vector<bool> wake(rings_.size(), false);
    for (Chunk* c : chunks) {
      std::size_t i = next_.fetch_add(1, std::memory_order_relaxed) % rings_.size();
      std::lock_guard lock(rings_[i]->m);
      rings_[i]->queue.push_back(c);
      if (rings_[i]->wants_wake) {
        rings_[i]->wants_wake = false;
        wake[i] = true;
      }
    }
    for (std::size_t i = 0; i < rings_.size(); ++i)
      if (wake[i]) poke(*rings_[i]);
  }

 private:
  struct Ring {
    io_uring ring{};
    int wake_fd = -1;
    std::uint64_t wake_value = 0;  // the armed eventfd read lands here
    std::mutex m;
    std::deque<Chunk*> queue;  // guarded by m
    bool stop = false;         // guarded by m
    bool wants_wake = false;   // guarded by m: the worker sleeps with free ring slots
    std::thread thread;
  };

  static void poke(Ring& r) {
    std::uint64_t one = 1;
    // eventfd writes only fail when the counter would overflow, which means a wake is pending anyway.
    [[maybe_unused]] ssize_t n = ::write(r.wake_fd, &one, sizeof one);
  }

  // Index of the registered region holding [p, p + n), or -1.
  int fixed_index(const char* p, std::size_t n) const {
    for (std::size_t i = 0; i < fixed_.size(); ++i) {
      const char* base = static_cast<const char*>(fixed_[i].iov_base);
      if (p >= base && p + n <= base + fixed_[i].iov_len) return static_cast<int>(i);
    }
    return -1;
  }

  void prep(io_uring_sqe* sqe, Chunk* c) {
    char* p = c->buf + c->done;
    unsigned n = static_cast<unsigned>(c->length - c->done);
    std::uint64_t off = c->offset + c->done;
    int fd = c->file->fd;
    int idx;
    {
      std::lock_guard lock(fixed_m_);
      idx = fixed_index(p, n);
    }
    if (c->op == IoOp::read) {
      if (idx >= 0)
        io_uring_prep_read_fixed(sqe, fd, p, n, off, idx);
      else
        io_uring_prep_read(sqe, fd, p, n, off);
    } else {
      if (idx >= 0)
        io_uring_prep_write_fixed(sqe, fd, p, n, off, idx);
      else
        io_uring_prep_write(sqe, fd, p, n, off);
    }
    io_uring_sqe_set_data(sqe, c);
  }

  void run(Ring& r) {
    std::deque<Chunk*> ready;          // taken from the queue, not yet in the ring
    std::vector<Chunk*> transferred;   // completed by the kernel, not yet verified and finished
    unsigned inflight = 0;
    bool wake_armed = false;
    const unsigned qd = options().queue_depth;
    // Takes queued blocks and prepares as many as the ring has room for. False: stopped and drained.
    auto fill = [&]() -> bool {
      std::lock_guard lock(r.m);
      while (!r.queue.empty()) {
        ready.push_back(r.queue.front());
        r.queue.pop_front();
      }
      if (r.stop && ready.empty() && inflight == 0) return false;
      while (inflight < qd && !ready.empty()) {
        io_uring_sqe* sqe = io_uring_get_sqe(&r.ring);
        if (!sqe) break;  // cannot happen: the ring has queue_depth + 1 entries
        prep(sqe, ready.front());
        ready.pop_front();
        ++inflight;
      }
      r.wants_wake = inflight < qd;  // decided under the lock enqueue() takes, so no wake is lost
      return true;
    };
    for (;;) {
      if (!wake_armed) {
        io_uring_sqe* sqe = io_uring_get_sqe(&r.ring);
        io_uring_prep_read(sqe, r.wake_fd, &r.wake_value, sizeof r.wake_value, 0);
        io_uring_sqe_set_data(sqe, nullptr);
        wake_armed = true;
      }
      if (!fill()) return;
      // One system call submits the whole batch and sleeps until at least one completion.
      int rc = io_uring_submit_and_wait(&r.ring, 1);
      if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
        // The ring itself is broken: fail what has not been issued; in-flight blocks still complete.
        std::string e = call_error("io_uring_submit_and_wait", -rc, __FILE__, __LINE__);
        for (Chunk* c : ready) finish(c, e);
        ready.clear();
        if (inflight == 0) {
          {
            std::lock_guard lock(r.m);
            if (r.stop && r.queue.empty()) return;
            r.wants_wake = true;
            if (!r.queue.empty()) continue;
          }
          // Sleep until new work or stop instead of spinning on a ring that keeps failing; new
          // work will then fail with the same error.
          std::uint64_t v;
          [[maybe_unused]] ssize_t n = ::read(r.wake_fd, &v, sizeof v);
          continue;
        }
      }
      unsigned head, seen = 0;
      io_uring_cqe* cqe;
      io_uring_for_each_cqe(&r.ring, head, cqe) {
        ++seen;
        auto* c = static_cast<Chunk*>(io_uring_cqe_get_data(cqe));
        if (!c) {
          wake_armed = false;
          continue;
        }
        --inflight;
        Outcome o = on_result(c, cqe->res);
        if (o == Outcome::again) ready.push_front(c);
        if (o == Outcome::transferred) transferred.push_back(c);
      }
      io_uring_cq_advance(&r.ring, seen);
      if (transferred.empty()) continue;
      // Refill the ring before verifying and finishing, so the disk works while the checksums run
      // (with --verify they took a fifth of read bandwidth when they ran first).
      fill();
      io_uring_submit(&r.ring);  // a failure leaves the entries queued for the next submit_and_wait
      for (Chunk* c : transferred) complete(c);
      transferred.clear();
    }
  }

  std::vector<std::unique_ptr<Ring>> rings_;
  std::atomic<std::size_t> next_{0};
  mutable std::mutex fixed_m_;
  std::vector<iovec> fixed_;
};

}  // namespace

std::unique_ptr<IoEngine> make_uring_engine(const EngineOptions& options, std::string* error) {
  auto e = std::make_unique<UringEngine>(options);
  Status s = e->start();
  if (!s) {
    *error = s.error();
    return nullptr;
  }
  return e;
}

}  // namespace memwall::io::detail
