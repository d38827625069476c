// HardwareProfile: what one machine (and a cluster of N of them) offers: GPU memory and achievable
// peak, link bandwidths, CPU memory, NVMe. Loaded from hardware_profiles/*.yaml or from the copies
// embedded in the binary, validated on load. Per-node quantities stay per node; derived per-GPU
// bandwidths ("3.0 GB/s per GPU when all 16 read") are computed here, once.
// Value type; loading functions are thread-safe.
#pragma once

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "model/result.hpp"

namespace memwall {

// What a profile may describe: far beyond any machine built, small enough that GPU counts stay
// exact in an int and a simulated platform fits in memory.
inline constexpr int kMaxNodes = 65536;
inline constexpr int kMaxGpusPerNode = 1024;

// Where a node's network interfaces sit, which decides what inter-node traffic crosses on its way
// out of a GPU: `pcie_switch` (DGX-2, DGX A100/H100: beside the GPUs on the PCIe switches, so it
// shares each GPU's PCIe link with offload traffic but not the node's PCIe root), `cpu` (behind
// the CPU's root complex, as on a workstation or a Grace CPU: it also crosses the PCIe root).
enum class NicAttach { pcie_switch, cpu };
const char* to_string(NicAttach a);

// Bytes CPU Adam moves per parameter (results/METRICS.md, "CPU Adam": fp32 master parameter,
// momentum and variance read and written, fp32 gradient read, 16-bit copy written). A profile's
// memory-bound Adam rate is cpu.memory_bandwidth / this.
inline constexpr double kAdamBytesPerParam = 30;

// gpu.kernels: measured rates of the operator kinds that are not linear layers, in the units the
// simulator costs them in (sim/replay.hpp): FLOP/s of the operator graph's FLOPs for the attention
// products and the LM head, bytes/s of its activation bytes (at the schedule's bytes per element)
// for the memory-bound ones. Written by `memwall calibrate`; absent kinds cost max(FLOPs / peak,
// bytes / gpu.memory_bandwidth).
struct KernelRate {
  std::string kind;  // an OpKind name of model/operator_graph.hpp
  double flops_per_s = 0;  // attention_scores, attention_context, lm_head
  double bytes_per_s = 0;  // embedding, layernorm, gelu, residual_add
};
// The kinds gpu.kernels may name, and whether each is a FLOP rate (else a byte rate).
bool kernel_kind_is_flop_rated(std::string_view kind);
const std::vector<std::string>& kernel_kinds();

// gpu.gemm: a measured GEMM rate at one shape (model/operator_graph.hpp's GemmShape), FLOP/s of
// forward and backward together (memwall calibrate times a block's linear layers, tiled and not).
struct GemmPoint {
  long m = 0, n = 0, k = 0;
  double flops_per_s = 0;
};

// A GEMM C(M x N) = A(M x K) B(K x N) on a GPU of `sms` streaming multiprocessors reaching
// `peak_flops_per_s` on large, well-shaped GEMMs, with `memory_Bps` of HBM (0: no roofline), after
// NVIDIA's Matrix Multiplication Background User's Guide: the output is cut into 256 x 128 tiles
// (the guide's A100 example; a partial tile costs a whole one: tile quantization), the SMs take one
// tile each per wave (a last, partial wave costs a whole one: wave quantization), so the time is
// waves x one tile's FLOPs at an SM's share of the peak; and no faster than its 16-bit operands and
// result through HBM (the roofline that binds small or thin GEMMs). Seconds. cuBLAS may choose
// smaller tiles for small GEMMs, which this model does not.
double datasheet_gemm_seconds(long m, long n, long k, int sms, double peak_flops_per_s, double memory_Bps);

struct PeakPoint {
  long hidden = 0;
  double flops_per_s = 0;
};

// gpu.reserve: device memory the software stack keeps on each GPU beside the training's states and
// buffers (issue 28 item 4). The planner, the schedule's capacity and the executor's admission all
// subtract it, through gpu_reserve_bytes (model/memory.hpp), never a copy of it. Fragmentation is
// not a field: memwall's executor places every buffer at an offset the schedule's memory plan
// chose, and the plan's own gaps (arena_bytes) are checked against the capacity left.
struct GpuReserve {
  double context_bytes = 0;       // the CUDA context: the driver's state and the loaded kernels
  double workspace_bytes = 0;     // the GEMM library's workspace (cuBLAS)
  double communicator_bytes = 0;  // one collective communicator's buffers (NCCL), per group of ranks
  bool given = false;             // the profile has gpu.reserve (else every part is 0)
};

// Latency of one link a transfer crosses (an NVLink, a PCIe hop, a NIC); links of the simulated
// platform carry none themselves: an idle route moves B bytes in B/W, and collectives add their
// steps' latencies (HardwareProfile::collective_step_latency_s).
constexpr double kLinkLatency_s = 1e-6;

struct HardwareProfile {
  std::string name;         // "dgx2"
  std::string description;  // one line for humans
  std::string source;       // file path, or "builtin:dgx2"

  int nodes = 1;
  int gpus_per_node = 0;

  double gpu_memory_bytes = 0;           // per GPU
  bool gpu_bf16 = false;                 // gpu.bf16: computes bf16 (Ampere and later); exports train bf16 then
  double gpu_peak_flops_per_s = 0;       // achievable peak (not the datasheet peak), per GPU
  double gpu_datasheet_peak_flops_per_s = 0;  // gpu.datasheet_peak: dense 16-bit tensor peak, what MFU
                                              // divides by (0: not given; MFU then uses gpu.peak)
  std::vector<PeakPoint> peak_by_hidden;  // optional, ascending hidden; interpolated in log2(hidden)
  double gpu_memory_Bps = 0;             // per GPU, HBM (gpu.memory_bandwidth); 0: not given, so the
                                         // simulator costs operators by FLOPs alone
  std::vector<KernelRate> kernels;       // gpu.kernels, optional
  GpuReserve gpu_reserve;                // gpu.reserve, optional
  std::vector<GemmPoint> gemm;           // gpu.gemm, optional
  int gpu_sms = 0;                       // gpu.sms: streaming multiprocessors per GPU (0: not given)
  // The rate of a linear layer's GEMMs of this shape (forward and backward together, gpu.gemm's
  // convention): the measured point nearest in log(m), log(n), log(k) (the same shape measured: its
  // own rate). Without gpu.gemm, on a datasheet profile (gpu.sms given, gpu.peak flat: no
  // peak_by_hidden), datasheet_gemm_rate's model; else 0 (the caller costs FLOPs at the peak).
  double gemm_rate(long m, long n, long k) const;
  // gpu.shared_peak (0: not given): the node's GPUs are one compute resource (the cpu backend's
  // devices are the host's cores and memory): all ranks of a node computing at once get this rate
  // together, split evenly; a rank alone computes at gpu.peak at most
  double gpu_shared_peak_flops_per_s = 0;
  const KernelRate* kernel(std::string_view kind) const;

  double gpu_gpu_Bps = 0;          // per GPU inside a node (NVLink/NVSwitch); 0 when one GPU per node
  double pcie_single_gpu_Bps = 0;  // one GPU alone to or from CPU memory
  double pcie_aggregate_Bps = 0;   // per node, all GPUs moving data at once (shared PCIe root)
  double inter_node_Bps = 0;       // per node (all NICs) as collectives get it: links.inter_node_measured when
                                   // given, else links.inter_node; 0 when the profile describes one node only
  double inter_node_nominal_Bps = 0;  // links.inter_node: the NICs' line rate
  NicAttach nic_attach = NicAttach::pcie_switch;  // links.nic_attach

  double cpu_memory_bytes = 0;         // per node
  double cpu_memory_Bps = 0;           // per node
  double cpu_adam_params_per_s = 0;    // per node, CPU Adam (ZeRO-Offload's CPU-Adam)
  double pinned_budget_bytes = 0;      // per node, page-locked host memory for staging buffers

  double nvme_capacity_bytes = 0;  // per node
  double nvme_read_Bps = 0;        // per node
  double nvme_write_Bps = 0;       // per node

  // Set when `memwall run` executes plans made for this profile (section `executor:`): the planner
  // then checks its choice with the executor's own buffer sizes, not the paper's. "cpu" or "cuda".
  std::string executor_backend;
  std::string executor_precision = "bf16";  // param16 / grad16 storage: bf16, fp16 or fp32

  int total_gpus() const { return nodes * gpus_per_node; }
  // GPUs of one node that a job of `gpus` ranks occupies: they share the node's CPU memory, pinned
  // budget, NVMe, DRAM and PCIe root (a 1-GPU job on a 16-GPU node has all of them to itself).
  int ranks_per_node(long gpus) const { return int(std::max(1L, std::min<long>(gpus_per_node, gpus))); }
  // Nodes a job of `gpus` ranks spans (dp x mp x pp of them, whole nodes first), at least 1.
  int nodes_for(long gpus) const { return int(std::max(1L, (gpus + gpus_per_node - 1) / gpus_per_node)); }

  // Achievable peak for a model of this hidden size (the paper: 62-78 TFLOPS for 8K-64K on V100).
  double peak_flops_per_s(long hidden) const;

  // Per-GPU bandwidths when every GPU of the node moves data at once (Fig. 2b's convention).
  double cpu_Bps_per_gpu_all_active() const { return cpu_Bps_per_gpu(gpus_per_node); }
  double nvme_read_Bps_per_gpu_all_active() const { return nvme_read_Bps_per_gpu(gpus_per_node); }
  double nvme_write_Bps_per_gpu_all_active() const { return nvme_write_Bps_per_gpu(gpus_per_node); }
  // The same with `active` GPUs of the node moving data at once (1 .. gpus_per_node): each gets a
  // 1/active share of the node's PCIe root, DRAM and NVMe, and at most its own PCIe link.
  double cpu_Bps_per_gpu(int active) const;
  double nvme_read_Bps_per_gpu(int active) const;
  double nvme_write_Bps_per_gpu(int active) const;

  // The latency one step of a collective waits for: every link it crosses adds kLinkLatency_s
  // (NVLink up and down inside a node: 2; another node's GPU through both NIC paths and NICs: 4,
  // or 6 with the NICs behind the CPU). The simulator's collectives (sim/replay.cpp, path_rates)
  // and the planner's (planner/fit.cpp) take it from here.
  double collective_step_latency_s(bool across_nodes) const {
    return (across_nodes ? (nic_attach == NicAttach::cpu ? 6 : 4) : 2) * kLinkLatency_s;
  }
};

// Parses and validates a profile from YAML text; `source` names the file in error messages.
Result<HardwareProfile> parse_profile(std::string_view yaml_text, const std::string& source);

// Loads a profile: a path to a .yaml file, or the name of an embedded one ("dgx2").
Result<HardwareProfile> load_profile(const std::string& name_or_path);

// The same machine, N of them ("--nodes N", 1 to kMaxNodes). Needs the profile's inter-node
// bandwidth when N > 1.
Result<HardwareProfile> scale_to_nodes(const HardwareProfile& profile, int nodes);

// Names of the profiles compiled into the binary, sorted.
std::vector<std::string> builtin_profile_names();

}  // namespace memwall
