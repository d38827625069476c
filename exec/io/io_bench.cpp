#include "exec/io/io_bench.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <numeric>
#include <random>

#include "exec/io/pinned_pool.hpp"
#include "exec/io/temp_file.hpp"
#include "model/units.hpp"

namespace memwall::io {
namespace {

using Clock = std::chrono::steady_clock;

// One phase: every block of the file once, in `order`, with one request per slot outstanding. The
// engine keeps queue_depth of them in the kernel; the other slots wait in its queue, so a freed
// kernel slot is refilled by the engine's thread at once, not after a round trip through this
// thread (as an executor submitting a whole chunk would). Slot k's buffer is reused only after its
// previous request completed.
Result<IoBenchPhase> run_phase(IoEngine& engine, const IoFile& file, const std::string& name, IoOp op,
                               const std::vector<std::uint64_t>& order, std::vector<PinnedBuffer>& slots,
                               const IoBenchOptions& o) {
  const std::size_t qd = slots.size();
  std::vector<IoHandle> inflight(qd);
  const std::uint64_t total = order.size() * o.block_bytes;
  const auto start = Clock::now();
  auto next_report = start + std::chrono::seconds(1);
  for (std::size_t i = 0; i < order.size(); ++i) {
    std::size_t k = i % qd;
    if (inflight[k].valid()) {
      Status s = inflight[k].wait();
      if (!s) {
        engine.wait_all();  // let the rest land before the buffers go away
        return make_error(s.error());
      }
    }
    std::uint64_t off = order[i] * o.block_bytes;
    inflight[k] = op == IoOp::read ? engine.read(file, off, slots[k].data(), o.block_bytes)
                                   : engine.write(file, off, slots[k].data(), o.block_bytes);
    if (o.progress && Clock::now() >= next_report) {
      double s = std::chrono::duration<double>(Clock::now() - start).count();
      double done = static_cast<double>(i * o.block_bytes);
      o.progress("io-bench: " + name + " " + format_bytes(done) + " of " + format_bytes(static_cast<double>(total)) +
                 ", " + format_bandwidth(done / s));
      next_report += std::chrono::seconds(1);
    }
  }
  Status s = engine.wait_all();
  if (!s) return make_error(s.error());
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return IoBenchPhase{name, total, seconds, static_cast<double>(total) / seconds};
}

}  // namespace

Result<IoBenchResult> run_io_bench(const IoBenchOptions& o) {
  if (o.block_bytes == 0 || o.block_bytes % kIoAlignment)
    return make_error("block size must be a positive multiple of 4096 bytes");
  if (o.size_bytes < o.block_bytes || o.size_bytes % o.block_bytes)
    return make_error("size must be a positive multiple of the block size");

  EngineOptions eo;
  eo.queue_depth = o.queue_depth;
  eo.block_bytes = o.block_bytes;
  eo.rings = o.rings;
  eo.verify = o.verify;
  eo.warn = o.warn;
  Result<std::unique_ptr<IoEngine>> engine = make_engine(o.engine, eo);
  if (!engine) return make_error(engine.error());
  IoEngine& e = **engine;

  IoBenchResult r;
  // Slabs for the window, locked if the memlock limit allows (reported either way).
  const std::size_t window = kWindowPerQueueSlot * o.queue_depth;
  Result<std::unique_ptr<PinnedPool>> pool =
      PinnedPool::create({.budget_bytes = window * o.block_bytes,
                          .slab_bytes = o.block_bytes,
                          .require_lock = false});
  if (!pool) return make_error(pool.error());
  r.pinned = (*pool)->stats().locked;
  r.huge_pages = huge_pages_available();
  if (!r.huge_pages)
    r.notes += "transparent huge pages are off (/sys/kernel/mm/transparent_hugepage/enabled): DMA into 4 KiB "
               "pages is slower; ";
  if (!r.pinned) r.notes += "buffers not locked (mlock failed: RLIMIT_MEMLOCK); ";
  if (o.engine == EngineKind::uring) {
    Status reg = e.register_buffers((*pool)->regions());
    r.registered_buffers = reg.ok();
    if (!reg) r.notes += "io_uring buffer registration failed: " + reg.error() + "; ";
  }
  std::vector<PinnedBuffer> slots;
  std::mt19937_64 rng(12345);
  for (std::size_t k = 0; k < window; ++k) {
    Result<PinnedBuffer> b = (*pool)->try_acquire(o.block_bytes);
    if (!b) return make_error(b.error());
    auto* p = static_cast<std::uint64_t*>(b->data());
    for (std::size_t j = 0; j < o.block_bytes / 8; ++j) p[j] = rng();  // incompressible data
    slots.push_back(std::move(b).value());
  }

  r.file = (std::filesystem::path(o.dir) / ("memwall-io-bench-" + std::to_string(::getpid()) + ".tmp")).string();
  TempFileGuard guard(r.file);  // removed on return, and on SIGINT, SIGTERM or SIGHUP
  Result<IoFile> file = e.open(r.file, {.create = true, .truncate = true, .preallocate_bytes = o.size_bytes});
  if (!file) return make_error(file.error());
  r.direct = file->direct();

  const std::uint64_t blocks = o.size_bytes / o.block_bytes;
  std::vector<std::uint64_t> seq(blocks);
  std::iota(seq.begin(), seq.end(), 0);
  std::vector<std::uint64_t> shuffled = seq;
  std::shuffle(shuffled.begin(), shuffled.end(), rng);

  struct Plan {
    const char* name;
    IoOp op;
    const std::vector<std::uint64_t>* order;
  };
  const Plan plans[] = {{"seq_write", IoOp::write, &seq},
                        {"seq_read", IoOp::read, &seq},
                        {"rand_write", IoOp::write, &shuffled},
                        {"rand_read", IoOp::read, &shuffled}};
  for (const Plan& p : plans) {
    Result<IoBenchPhase> ph = run_phase(e, *file, p.name, p.op, *p.order, slots, o);
    if (!ph) return make_error(ph.error());
    r.phases.push_back(*ph);
  }
  r.verified_bytes = e.counters().bytes_verified;
  r.write_Bps = r.phases[0].Bps;
  r.read_Bps = r.phases[1].Bps;
  r.rand_write_Bps = r.phases[2].Bps;
  r.rand_read_Bps = r.phases[3].Bps;
  return r;
}

}  // namespace memwall::io
