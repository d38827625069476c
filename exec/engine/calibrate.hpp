// calibrate: measures the machine `memwall run` executes on, so the simulator's profile describes
// it (`memwall calibrate -o my.yaml`). Every number comes from the executor's own code paths:
//   GEMM FLOP/s by hidden size  the four linear operators of one GPT block (GptOps, forward and
//                               backward, with the engine's 16-bit -> fp32 weight widening),
//                               FLOPs as the operator graph counts them -> gpu.peak_by_hidden
//   kernels                     every other operator kind of the block, at one shape, in the units
//                               the simulator costs it in -> gpu.kernels (model/hardware_profile.hpp)
//   device memory bandwidth     the backend's residual kernel (2 reads, 1 write) -> gpu.memory_bandwidth
//   host <-> device copies      the backend's copy streams, one stream and several at once, from
//                               page-locked host memory -> links.pcie_single_gpu / pcie_aggregate
//   NVMe                        io::run_io_bench through the engine's io_uring engine, at the
//                               engine's queue depth and block size, O_DIRECT -> nvme.read / write
//   CPU Adam, DRAM              adam::run_adam_bench (CpuAdam step; STREAM triad) -> cpu.*
//   collectives                 MPI (cpu) all-reduce between the job's ranks under mpirun ->
//                               links.gpu_gpu (bus bandwidth); not measured in a single process
// What cannot be measured is reported as such and left out of the profile, never guessed.
// Runs collectively when started by mpirun (every rank measures; rank 0's numbers are written).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "exec/adam/adam_types.hpp"
#include "exec/adam/host_cores.hpp"
#include "exec/backend/backend.hpp"
#include "model/hardware_profile.hpp"
#include "model/result.hpp"
#include "model/units.hpp"

namespace memwall::exec {

struct CalibrateOptions {
  std::string backend = "cpu";
  std::string nvme_dir;                        // empty: NVMe not measured
  std::vector<int> hiddens = {128, 256, 512, 1024};  // GEMM sweep (multiples of head_size)
  int kernel_hidden = 256;                     // the shape the other kernels are measured at
  std::vector<int> gemm_tilings = {2, 4};      // tiling factors the sweep also times the linear layers at
  int bsz = 8, seq = 64, head_size = 64;       // B, T and C / NH of every measured block
  adam::DType precision = adam::DType::bf16;   // parameters as the engine stores them
  double device_memory_bytes = 64.0 * (1 << 20);  // cpu: the "device" capacity to write (chosen)
  double pinned_budget_bytes = 512.0 * (1 << 20);  // written as cpu.pinned_budget (chosen)
  std::uint64_t nvme_bytes = std::uint64_t{1} << 30;  // io-bench file size
  std::size_t adam_params = 16'000'000;
  // Timed iterations of each block: at least this many (and 3), more while the block has run under
  // 0.4 s, up to 50. More samples tell the spread of a jittery machine's iterations more surely.
  int block_iterations = 3;
  std::function<void(const std::string&)> progress;
  // A machine other programs keep busy (half a core or more, exec/adam/host_cores.hpp, looked at
  // for 0.5 s first) is refused: its figures would be the share the others leave. allow_busy
  // measures anyway, with the threads that share fits, and the profile says what load it saw.
  bool allow_busy = false;
  // Tests: wraps the backend every measurement runs on (a fault-injecting wrapper around the real one).
  std::function<std::unique_ptr<Backend>(std::unique_ptr<Backend>)> wrap_backend;
};


// One field of the profile: where it goes, its value, how it was measured.
struct Measurement {
  std::string field;  // "gpu.peak", "nvme.read", "gpu.kernels.gelu"
  double value = 0;   // in the field's dimension (bytes, bytes/s, FLOP/s, params/s); 0 = not measured
  std::string how;    // the comment written beside it, or why it was not measured
};

// The dimension of a calibrated field ("nvme.read": bandwidth), for the YAML and for people.
Dimension calibration_dimension(const std::string& field);

struct Calibration {
  std::string backend, device;
  int ranks = 1;
  adam::DType precision = adam::DType::bf16;
  std::vector<PeakPoint> peak_by_hidden;
  std::vector<GemmPoint> gemm;  // gpu.gemm: every linear layer's GEMM at each hidden, untiled and tiled
  std::vector<KernelRate> kernels;
  std::vector<Measurement> fields;  // in profile order
  double seconds = 0;               // the calibration's own wall time
  int threads = 1;                  // host threads of the measurements (the backend's, CPU Adam's)
  double jitter = 0;                // the largest spread of a timed block's iterations ((p90 - p10) / median)
  adam::CpuLoad load_before, load_during;  // other programs' load: the first look, and over the measurements
  std::vector<std::string> warnings;       // what makes the figures doubtful (a busy machine)
  const Measurement* find(const std::string& field) const;
};

// Above this jitter a calibration warns: its machine's speed varies more than validate's 10 % bar.
constexpr double kJitterWarn = 0.10;

Result<Calibration> calibrate(const CalibrateOptions& options);

// A hardware profile (hardware_profiles/*.yaml's schema) of this machine, each measured field with
// its comment; parse_profile accepts it.
std::string calibration_yaml(const Calibration& c, const std::string& name);

}  // namespace memwall::exec
