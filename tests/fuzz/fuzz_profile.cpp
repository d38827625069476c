// libFuzzer target: hardware profile YAML (parse_profile). Accepted profiles must hold only finite,
// positive quantities and counts in range, whatever the input.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "model/hardware_profile.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace memwall;
  Result<HardwareProfile> r = parse_profile(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.yaml");
  if (fuzz::refused_in_one_line(r)) return 0;
  const HardwareProfile& p = *r;
  if (p.nodes < 1 || p.nodes > kMaxNodes || p.gpus_per_node < 1 || p.gpus_per_node > kMaxGpusPerNode)
    fuzz::fail("counts out of range", p.name);
  for (double v : {p.gpu_memory_bytes, p.gpu_peak_flops_per_s, p.pcie_single_gpu_Bps, p.pcie_aggregate_Bps,
                   p.cpu_memory_bytes, p.cpu_memory_Bps, p.cpu_adam_params_per_s, p.pinned_budget_bytes,
                   p.nvme_capacity_bytes, p.nvme_read_Bps, p.nvme_write_Bps, p.cpu_Bps_per_gpu_all_active(),
                   p.nvme_read_Bps_per_gpu_all_active(), p.peak_flops_per_s(4096)})
    fuzz::finite_positive(v, "profile quantity");
  Result<HardwareProfile> scaled = scale_to_nodes(p, 2);
  fuzz::refused_in_one_line(scaled);
  return 0;
}
