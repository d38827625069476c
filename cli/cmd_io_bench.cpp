// `memwall io-bench`: sequential and random read/write bandwidth of the NVMe engine (exec/io) on
// one directory's filesystem. Parses flags and prints; exec/io/io_bench.cpp measures.
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>

#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/cli_common.hpp"
#include "cli/commands.hpp"
#include "exec/io/io_bench.hpp"
#include "model/training_config.hpp"
#include "model/units.hpp"

namespace memwall::cli {
namespace {

struct IoBenchFlags {
  std::string dir;
  std::string size = "4GiB";
  std::string block = "1MiB";
  int qd = 32;
  int rings = 1;
  std::string engine = "uring";
  bool json = false;
  bool verify = false;
};

// The psync engine runs one thread per request in flight.
constexpr int kMaxPsyncThreads = 1024;

io::IoBenchOptions validate(const IoBenchFlags& f) {
  io::IoBenchOptions o;
  std::error_code ec;
  const std::filesystem::file_status st = std::filesystem::status(f.dir, ec);
  if (st.type() == std::filesystem::file_type::not_found) throw UsageError("--dir: " + f.dir + ": no such directory");
  if (ec) throw UsageError("--dir: " + f.dir + ": " + ec.message());
  if (st.type() != std::filesystem::file_type::directory) throw UsageError("--dir: " + f.dir + ": not a directory");
  if (::access(f.dir.c_str(), W_OK | X_OK) != 0)
    throw UsageError("--dir: " + f.dir + ": cannot create files there: " + std::strerror(errno));
  o.dir = f.dir;
  o.block_bytes = std::size_t(parse_quantity_flag("--block", f.block, Dimension::bytes, 1, double(1u << 30)));
  if (o.block_bytes % io::kIoAlignment)
    throw UsageError("--block: expected a multiple of 4 KiB (O_DIRECT) up to 1 GiB, got " + f.block);
  const double size = parse_quantity_flag("--size", f.size, Dimension::bytes, double(o.block_bytes), 1e18);
  o.size_bytes = std::uint64_t(size);
  if (size != std::floor(size) || o.size_bytes % o.block_bytes)
    throw UsageError("--size: expected a whole number of --block (" + format_bytes(double(o.block_bytes)) +
                     ") blocks, got " + f.size);
  struct statvfs fs {};
  if (::statvfs(f.dir.c_str(), &fs) == 0) {
    const double free_bytes = double(fs.f_bavail) * double(fs.f_frsize);
    if (size > free_bytes)
      throw UsageError("--size: " + format_bytes(size) + " does not fit in " + f.dir + " (" + format_bytes(free_bytes) +
                       " free)");
  }
  Result<io::EngineKind> k = io::parse_engine_kind(f.engine);
  if (!k) throw UsageError("--engine: " + k.error());
  o.engine = *k;
  if (o.engine == io::EngineKind::psync && f.qd > kMaxPsyncThreads)
    throw UsageError("--qd: the psync engine runs one thread per request in flight: at most " +
                     std::to_string(kMaxPsyncThreads) + ", got " + std::to_string(f.qd));
  o.queue_depth = static_cast<unsigned>(f.qd);
  o.rings = static_cast<unsigned>(f.rings);
  o.verify = f.verify;
  // Buffers for every request in flight and queued (kWindowPerQueueSlot per slot), locked if allowed.
  const double window = double(io::kWindowPerQueueSlot) * f.qd * double(o.block_bytes);
  const double memory = machine_memory_bytes();
  if (window > memory / 4)
    throw UsageError("--qd/--block: " + std::to_string(io::kWindowPerQueueSlot * f.qd) + " buffers of " +
                     format_bytes(double(o.block_bytes)) + " (" + format_bytes(window) +
                     ") are more than a quarter of this machine's " + format_bytes(memory) + " memory");
  return o;
}

}  // namespace

Command add_io_bench(CLI::App& app) {
  auto f = std::make_shared<IoBenchFlags>();
  CLI::App* sub = app.add_subcommand(
      "io-bench",
      "Measure sequential and random read/write bandwidth of the NVMe offload engine on one filesystem.\n"
      "Writes one temporary file of --size in --dir (removed afterwards), then reads it, with --qd requests\n"
      "of --block bytes in flight, O_DIRECT and pinned buffers. Progress goes to stderr when it is a terminal.\n"
      "Compare with fio in the same run: bench/io/io_vs_fio.sh DIR");
  sub->add_option("--dir", f->dir, "Directory on the filesystem to measure (must exist)")->required();
  sub->add_option("--size", f->size, "Bytes per phase: the temporary file's size, a multiple of --block")
      ->capture_default_str();
  sub->add_option("--block", f->block, "Bytes per request, a multiple of 4 KiB up to 1 GiB")->capture_default_str();
  add_int(*sub, "--qd", f->qd, 1, 4096, "Queue depth: requests in flight");
  add_int(*sub, "--rings", f->rings, 1, 64, "io_uring instances, one submitting thread each (uring only)");
  sub->add_option("--engine", f->engine, "uring (liburing) or psync (pread/pwrite threads, one per --qd)")
      ->capture_default_str();
  sub->add_flag("--json", f->json, "JSON output (read_Bps, write_Bps, rand_read_Bps, rand_write_Bps, phases)");
  sub->add_flag("--verify", f->verify,
                "Check every block read against a checksum taken when it was written; a mismatch stops with the\n"
                "file and offset (exit 1)");
  return {sub, [f]() {
            io::IoBenchOptions o = validate(*f);
            const bool tty = ::isatty(STDERR_FILENO);
            o.progress = [](const std::string& line) { std::cerr << line << "\n"; };
            if (!tty) o.progress = nullptr;  // progress is for people watching; logs get the result only
            o.warn = [](const std::string& w) { std::cerr << w << "\n"; };
            Result<io::IoBenchResult> r = io::run_io_bench(o);
            if (!r) {
              std::cerr << "memwall io-bench: " << r.error() << "\n";
              return 1;
            }
            const io::IoBenchResult& b = *r;
            const std::string page_cache_note =
                "buffered I/O (the filesystem does not do O_DIRECT): these numbers include the page cache";
            if (f->json) {
              nlohmann::ordered_json j;
              j["dir"] = o.dir;
              j["engine"] = io::to_string(o.engine);
              j["direct"] = b.direct;
              j["pinned"] = b.pinned;
              j["registered_buffers"] = b.registered_buffers;
              j["huge_pages"] = b.huge_pages;
              j["size_bytes"] = o.size_bytes;
              j["block_bytes"] = o.block_bytes;
              j["queue_depth"] = o.queue_depth;
              j["rings"] = o.rings;
              j["read_Bps"] = b.read_Bps;
              j["write_Bps"] = b.write_Bps;
              j["rand_read_Bps"] = b.rand_read_Bps;
              j["rand_write_Bps"] = b.rand_write_Bps;
              nlohmann::ordered_json phases = nlohmann::ordered_json::array();
              for (const auto& p : b.phases)
                phases.push_back({{"name", p.name}, {"bytes", p.bytes}, {"seconds", p.seconds}, {"Bps", p.Bps}});
              j["phases"] = phases;
              if (o.verify) j["verified_bytes"] = b.verified_bytes;
              if (!b.direct) j["note"] = page_cache_note;
              write_output("", j.dump(2) + "\n");
            } else {
              std::ostringstream out;
              out << "memwall io-bench: " << o.dir << ", " << io::to_string(o.engine) << " engine, "
                  << (b.direct ? "O_DIRECT" : "buffered") << ", " << format_bytes(double(o.size_bytes)) << " file, "
                  << format_bytes(double(o.block_bytes)) << " blocks, queue depth " << o.queue_depth;
              if (o.engine == io::EngineKind::uring) out << ", " << o.rings << " ring(s)";
              out << "\nbuffers: " << format_bytes(double(io::kWindowPerQueueSlot * o.queue_depth) * double(o.block_bytes))
                  << (b.pinned ? " pinned (mlock)" : " NOT pinned")
                  << (b.registered_buffers ? ", registered with io_uring" : "")
                  << (b.huge_pages ? ", huge pages" : "") << "\n\n";
              std::vector<std::vector<std::string>> t = {{"phase", "bandwidth", "bytes", "time"}};
              for (const auto& p : b.phases)
                t.push_back({p.name, format_bandwidth(p.Bps), format_bytes(double(p.bytes)),
                             format_sig(p.seconds) + " s"});
              out << render_table(t);
              if (o.verify)
                out << "\nverified: " << format_bytes(double(b.verified_bytes))
                    << " read, every 4 KiB block as it was written\n";
              if (!b.direct) out << "\nnote: " << page_cache_note << "\n";
              if (!b.notes.empty()) out << "note: " << b.notes << "\n";
              write_output("", out.str());
            }
            return 0;
          }};
}

}  // namespace memwall::cli
