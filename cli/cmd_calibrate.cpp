// `memwall calibrate`: measures this machine as `memwall run` uses it (exec/engine/calibrate) and
// writes a hardware profile the simulator and the planner read, each field with how it was
// measured. Parses and prints.
#include <filesystem>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli/cli_common.hpp"
#include "cli/commands.hpp"
#include "exec/adam/cpu_adam.hpp"
#include "exec/engine/calibrate.hpp"
#include "exec/engine/collectives.hpp"
#include "model/hardware_profile.hpp"
#include "model/units.hpp"

namespace memwall::cli {
namespace {

// Rank 0, once the profile is written: the other ranks wait for it in a barrier (see below).
void release_other_ranks() {
  if (exec::MpiWorld::get().size() <= 1) return;
  if (Result<std::unique_ptr<exec::Collectives>> mpi = exec::make_mpi_collectives(); mpi)
    if (Result<bool> done = (*mpi)->barrier(); !done)
      throw std::runtime_error("calibrate: releasing the other ranks: " + done.error());
}

struct CalibrateFlags {
  std::string backend = "cpu";
  std::string nvme_dir;
  std::string output;
  std::string name = "calibrated";
  std::string precision = "bf16";
  std::vector<int> hiddens = {128, 256, 512, 1024};
  std::vector<int> gemm_tilings = {2, 4};
  int kernel_hidden = 256;
  int bsz = 8, seq = 64, head_size = 64;
  std::string device_memory = "64 MiB";
  std::string nvme_size = "1 GiB";
  bool quick = false;
  bool allow_busy = false;
};

}  // namespace

Command add_calibrate(CLI::App& app) {
  auto f = std::make_shared<CalibrateFlags>();
  CLI::App* sub = app.add_subcommand(
      "calibrate",
      "Measure this machine as `memwall run` uses it and write a hardware profile: GEMM FLOP/s by hidden\n"
      "size and the other GPT kernels (the executor's own, at the executor's precision), device memory\n"
      "bandwidth, host <-> device copies on one and two streams, NVMe through the io engine (io_uring,\n"
      "O_DIRECT, the engine's block size and queue depth), CPU Adam, DRAM, and the all-reduce between\n"
      "ranks under mpirun. Each field carries a comment saying how it was measured; what cannot be\n"
      "measured is left out. An operator's time is its median over several block iterations (what a\n"
      "training iteration meets), a transfer's the best of several runs; the profile says how far apart\n"
      "the same block's iterations ran (a warning above 10 %). A machine other programs keep busy (half\n"
      "a core or more) is refused, naming them. About 30 s.\n"
      "  memwall calibrate --nvme-dir /tmp -o my.yaml\n"
      "  memwall validate --profile my.yaml --config exec/data/run.yaml --strategy zero_inf_cpu");
  sub->add_option("--backend", f->backend, "cpu or cuda (default cpu)");
  sub->add_option("--nvme-dir", f->nvme_dir, "Folder on the disk that holds swap files (memwall run --nvme-dir)")
      ->required();
  sub->add_option("-o,--output", f->output, "Profile file to write (default: stdout)");
  sub->add_option("--name", f->name, "The profile's name (default: calibrated)");
  sub->add_option("--precision", f->precision, "Parameter precision of the runs it describes: bf16 (default), fp16, fp32");
  sub->add_option("--hidden", f->hiddens, "Hidden sizes of the GEMM sweep (default 128 256 512 1024)")->delimiter(',');
  sub->add_option("--gemm-tiling", f->gemm_tilings,
                  "Tiling factors at which the sweep also times the linear layers, split as memory-centric tiling\n"
                  "splits them, for gpu.gemm (default 2 4; 1: none)")
      ->delimiter(',');
  add_int(*sub, "--kernel-hidden", f->kernel_hidden, 1, 65536,
          "Hidden size at which the other kernels are measured (default 256)");
  add_int(*sub, "--bsz", f->bsz, 1, 4096, "Micro-batch of the measured blocks (default 8)");
  add_int(*sub, "--seq", f->seq, 1, 65536, "Sequence length of the measured blocks (default 64)");
  add_int(*sub, "--head-size", f->head_size, 1, 1024, "Channels per attention head (default 64)");
  sub->add_option("--device-memory", f->device_memory,
                  "cpu backend: the device capacity to write as gpu.memory (default 64 MiB; chosen, not measured)");
  sub->add_option("--nvme-size", f->nvme_size, "Bytes the NVMe measurement writes and reads (default 1 GiB)");
  sub->add_flag("--quick", f->quick, "Smaller measurements (hidden 128 and 256, 256 MiB of NVMe): for tests");
  sub->add_flag("--allow-busy", f->allow_busy,
                "Measure even when other programs keep the CPUs busy: the profile then describes the share they\n"
                "leave (with the threads that fit it), and says what load it saw");
  return {sub, [f, sub]() {
            exec::CalibrateOptions o;
            if (f->backend != "cpu" && f->backend != "cuda")
              throw UsageError("--backend: expected cpu or cuda, got \"" + f->backend + "\"");
            o.backend = f->backend;
            if (exec::MpiWorld::get().rank() == 0) check_output_file("-o", f->output);
            namespace fs = std::filesystem;
            std::error_code ec;
            if (!fs::is_directory(f->nvme_dir, ec))
              throw UsageError("--nvme-dir: " + f->nvme_dir + ": not a folder");
            o.nvme_dir = f->nvme_dir;
            Result<adam::DType> precision = adam::parse_dtype(f->precision);
            if (!precision) throw UsageError("--precision: " + precision.error());
            o.precision = *precision;
            for (int h : f->hiddens)
              if (h < 1 || h > 65536) throw UsageError("--hidden: expected sizes from 1 to 65536, got " + std::to_string(h));
            o.hiddens = f->hiddens;
            for (int t : f->gemm_tilings)
              if (t < 1 || t > 64) throw UsageError("--gemm-tiling: expected factors from 1 to 64, got " + std::to_string(t));
            o.gemm_tilings = f->gemm_tilings;
            o.kernel_hidden = f->kernel_hidden;
            o.bsz = f->bsz;
            o.seq = f->seq;
            o.head_size = f->head_size;
            o.device_memory_bytes = parse_quantity_flag("--device-memory", f->device_memory, Dimension::bytes,
                                                        1 << 20, 1e15);
            o.nvme_bytes = std::uint64_t(parse_quantity_flag("--nvme-size", f->nvme_size, Dimension::bytes,
                                                             16 << 20, 1e13)) / (1 << 20) * (1 << 20);
            if (f->quick) {
              if (sub->count("--hidden") == 0) o.hiddens = {128, 256};
              if (sub->count("--nvme-size") == 0) o.nvme_bytes = 256u << 20;
              o.adam_params = 4'000'000;
            }
            const bool lead = exec::MpiWorld::get().rank() == 0;
            o.allow_busy = f->allow_busy;
            if (lead) o.progress = [](const std::string& s) { std::cerr << "calibrate: " << s << std::endl; };
            exec::Calibration c = take(exec::calibrate(o));
            if (lead)
              for (const std::string& w : c.warnings) std::cerr << "memwall calibrate: warning: " << w << "\n";
            // rank 0 writes the profile (on the cpu backend it alone measures the device's rates);
            // the others wait for it, so that the job's ranks leave MPI together
            if (!lead) {
              if (Result<std::unique_ptr<exec::Collectives>> mpi = exec::make_mpi_collectives(); mpi)
                if (Result<bool> done = (*mpi)->barrier(); !done)
                  throw std::runtime_error("calibrate: waiting for rank 0 to write the profile: " + done.error());
              return 0;
            }
            const std::string yaml = exec::calibration_yaml(c, f->name);
            // what we write must load as a profile: the same reader as every other command
            Result<HardwareProfile> check = parse_profile(yaml, f->output.empty() ? "<calibrate>" : f->output);
            if (!check) throw std::runtime_error("calibrate wrote a profile that does not load: " + check.error());
            if (f->output.empty()) {
              write_output("", yaml);
              release_other_ranks();
              return 0;
            }
            write_output(f->output, yaml);
            std::vector<std::vector<std::string>> rows = {{"field", "value", "how"}};
            for (const PeakPoint& p : check->peak_by_hidden)
              rows.push_back({"gpu.peak_by_hidden", "hidden " + std::to_string(p.hidden) + ": " +
                              format_flops_rate(p.flops_per_s), "GEMMs of a block"});
            for (const KernelRate& k : check->kernels)
              rows.push_back({"gpu.kernels." + k.kind,
                              k.flops_per_s > 0 ? format_flops_rate(k.flops_per_s) : format_bandwidth(k.bytes_per_s),
                              "forward + backward at hidden " + std::to_string(o.kernel_hidden)});
            for (const exec::Measurement& m : c.fields)
              rows.push_back({m.field, m.value > 0 ? format_quantity(m.value, exec::calibration_dimension(m.field)) : "-",
                              m.how});
            std::cout << "memwall calibrate: " << c.backend << " (" << c.device << ") in " << format_sig(c.seconds, 3)
                      << " s; wrote " << f->output << "\n" << render_table(rows) << std::flush;
            release_other_ranks();
            return 0;
          }};
}

}  // namespace memwall::cli
