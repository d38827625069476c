#include "model/hardware_profile.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "model/builtin_profiles.hpp"
#include "model/suggest.hpp"
#include "model/units.hpp"
#include "model/yaml_reader.hpp"

namespace memwall {

const char* to_string(NicAttach a) { return a == NicAttach::cpu ? "cpu" : "pcie_switch"; }

const std::vector<std::string>& kernel_kinds() {
  static const std::vector<std::string> kinds = {"embedding", "layernorm", "attention_scores", "attention_context",
                                                 "gelu", "residual_add", "lm_head"};
  return kinds;
}

bool kernel_kind_is_flop_rated(std::string_view kind) {
  return kind == "attention_scores" || kind == "attention_context" || kind == "lm_head";
}

const KernelRate* HardwareProfile::kernel(std::string_view kind) const {
  for (const KernelRate& k : kernels)
    if (k.kind == kind) return &k;
  return nullptr;
}

double HardwareProfile::peak_flops_per_s(long hidden) const {
  if (peak_by_hidden.empty() || hidden <= 0) return gpu_peak_flops_per_s;
  if (hidden <= peak_by_hidden.front().hidden) return peak_by_hidden.front().flops_per_s;
  if (hidden >= peak_by_hidden.back().hidden) return peak_by_hidden.back().flops_per_s;
  for (size_t i = 1; i < peak_by_hidden.size(); ++i) {
    const PeakPoint& a = peak_by_hidden[i - 1];
    const PeakPoint& b = peak_by_hidden[i];
    if (hidden <= b.hidden) {
      double t = std::log2(double(hidden) / a.hidden) / std::log2(double(b.hidden) / a.hidden);
      return a.flops_per_s + t * (b.flops_per_s - a.flops_per_s);
    }
  }
  return gpu_peak_flops_per_s;
}

double datasheet_gemm_seconds(long m, long n, long k, int sms, double peak_flops_per_s, double memory_Bps) {
  constexpr long kTileM = 256, kTileN = 128;
  if (m < 1 || n < 1 || k < 1 || sms < 1 || !(peak_flops_per_s > 0)) return 0;
  const double tiles = double((m + kTileM - 1) / kTileM) * double((n + kTileN - 1) / kTileN);
  const double waves = std::ceil(tiles / sms);
  const double compute = waves * 2.0 * kTileM * kTileN * double(k) / (peak_flops_per_s / sms);
  const double bytes = 2.0 * (double(m) * double(k) + double(k) * double(n) + double(m) * double(n));
  return std::max(compute, memory_Bps > 0 ? bytes / memory_Bps : 0.0);
}

double HardwareProfile::gemm_rate(long m, long n, long k) const {
  if (gemm.empty()) {
    if (gpu_sms < 1 || !peak_by_hidden.empty()) return 0;
    // forward Y = X W^T (m x n over k), backward dX = dY W (m x k over n) and dW = dY^T X (n x k over m)
    const double t = datasheet_gemm_seconds(m, n, k, gpu_sms, gpu_peak_flops_per_s, gpu_memory_Bps) +
                     datasheet_gemm_seconds(m, k, n, gpu_sms, gpu_peak_flops_per_s, gpu_memory_Bps) +
                     datasheet_gemm_seconds(n, k, m, gpu_sms, gpu_peak_flops_per_s, gpu_memory_Bps);
    return t > 0 ? 3 * 2.0 * double(m) * double(n) * double(k) / t : 0;
  }
  double best = -1, rate = 0;
  for (const GemmPoint& g : gemm) {
    auto d = [](long a, long b) { return std::log(double(std::max(1L, a)) / double(std::max(1L, b))); };
    const double dist = d(m, g.m) * d(m, g.m) + d(n, g.n) * d(n, g.n) + d(k, g.k) * d(k, g.k);
    if (best < 0 || dist < best) best = dist, rate = g.flops_per_s;
  }
  return rate;
}

double HardwareProfile::cpu_Bps_per_gpu(int active) const {
  const double n = std::clamp(active, 1, std::max(1, gpus_per_node));
  return std::min({pcie_single_gpu_Bps, pcie_aggregate_Bps / n, cpu_memory_Bps / n});
}
double HardwareProfile::nvme_read_Bps_per_gpu(int active) const {
  const double n = std::clamp(active, 1, std::max(1, gpus_per_node));
  return std::min({pcie_single_gpu_Bps, pcie_aggregate_Bps / n, nvme_read_Bps / n});
}
double HardwareProfile::nvme_write_Bps_per_gpu(int active) const {
  const double n = std::clamp(active, 1, std::max(1, gpus_per_node));
  return std::min({pcie_single_gpu_Bps, pcie_aggregate_Bps / n, nvme_write_Bps / n});
}

namespace {

// Reads every field of a profile in the file's own order (gpu, links, cpu, nvme, executor), one
// line each with its unit and range: ~85 lines on purpose, so it reads beside the YAML it parses.
HardwareProfile read_profile(const YamlReader& r) {
  const YAML::Node& root = r.root();
  r.only_keys(root, "", {"name", "description", "nodes", "gpu", "links", "cpu", "nvme", "executor"});
  HardwareProfile p;
  p.name = r.text(root, "", "name");
  p.description = r.text_or(root, "", "description", "");
  p.nodes = int(r.integer_or(root, "", "nodes", 1, kMaxNodes, 1));

  YAML::Node gpu = r.section(root, "", "gpu");
  r.only_keys(gpu, "gpu", {"count_per_node", "memory", "memory_bandwidth", "peak", "peak_by_hidden", "kernels", "bf16",
                           "datasheet_peak", "reserve", "shared_peak", "gemm", "sms"});
  p.gpu_bf16 = r.boolean_or(gpu, "gpu", "bf16", false);
  p.gpus_per_node = int(r.integer(gpu, "gpu", "count_per_node", 1, kMaxGpusPerNode));
  p.gpu_memory_bytes = r.quantity(gpu, "gpu", "memory", Dimension::bytes);
  p.gpu_peak_flops_per_s = r.quantity(gpu, "gpu", "peak", Dimension::flops_rate);
  p.gpu_memory_Bps = r.quantity_or(gpu, "gpu", "memory_bandwidth", Dimension::bandwidth, 0);
  p.gpu_datasheet_peak_flops_per_s = r.quantity_or(gpu, "gpu", "datasheet_peak", Dimension::flops_rate, 0);
  p.gpu_shared_peak_flops_per_s = r.quantity_or(gpu, "gpu", "shared_peak", Dimension::flops_rate, 0);
  p.gpu_sms = int(r.integer_or(gpu, "gpu", "sms", 1, 100000, 0));
if (p.gpu_datasheet_peak_flops_per_s > 0 && p.gpu_datasheet_peak_flops_per_s < p.gpu_peak_flops_per_s)
    r.fail(gpu["datasheet_peak"], "gpu.datasheet_peak",
           "expected at least gpu.peak (" + format_flops_rate(p.gpu_peak_flops_per_s) +
               "): the datasheet peak bounds what the GPU achieves");
  if (YAML::Node table = gpu["peak_by_hidden"]; table.IsDefined() && !table.IsNull()) {
    if (!table.IsSequence() || table.size() == 0 || table.size() > 64)
      r.fail(table, "gpu.peak_by_hidden", "expected a list of 1 to 64 points {hidden: 8K, peak: 62 TFLOPS}");
    for (size_t i = 0; i < table.size(); ++i) {
      std::string path = "gpu.peak_by_hidden[" + std::to_string(i) + "]";
      if (!table[i].IsMap()) r.fail(table[i], path, "expected {hidden: 8K, peak: 62 TFLOPS}");
      r.only_keys(table[i], path, {"hidden", "peak"});
      PeakPoint pt{r.hidden(table[i], path, "hidden"), r.quantity(table[i], path, "peak", Dimension::flops_rate)};
      if (!p.peak_by_hidden.empty() && pt.hidden <= p.peak_by_hidden.back().hidden)
        r.fail(table[i], path + ".hidden", "expected hidden sizes in ascending order");
      p.peak_by_hidden.push_back(pt);
    }
  }

  if (YAML::Node table = gpu["gemm"]; table.IsDefined() && !table.IsNull()) {
    const char* form = "{m: 512, n: 768, k: 256, rate: 150 GFLOPS}";
    if (!table.IsSequence() || table.size() == 0 || table.size() > 4096)
      r.fail(table, "gpu.gemm", std::string("expected a list of 1 to 4096 measured shapes ") + form);
    for (size_t i = 0; i < table.size(); ++i) {
      const std::string path = "gpu.gemm[" + std::to_string(i) + "]";
      if (!table[i].IsMap()) r.fail(table[i], path, std::string("expected ") + form);
      r.only_keys(table[i], path, {"m", "n", "k", "rate"});
      p.gemm.push_back({r.integer(table[i], path, "m", 1, 1L << 31), r.integer(table[i], path, "n", 1, 1L << 31),
                        r.integer(table[i], path, "k", 1, 1L << 31),
                        r.quantity(table[i], path, "rate", Dimension::flops_rate)});
    }
  }

  if (YAML::Node k = gpu["kernels"]; k.IsDefined() && !k.IsNull()) {
    std::string kinds;
    for (const std::string& n : kernel_kinds()) kinds += (kinds.empty() ? "" : ", ") + n;
    if (!k.IsMap()) r.fail(k, "gpu.kernels", "expected a mapping of operator kinds (" + kinds + ") to measured rates");
    r.only_keys(k, "gpu.kernels", kernel_kinds());
    for (const std::string& n : kernel_kinds()) {
      if (!k[n].IsDefined()) continue;
      KernelRate kr{n, 0, 0};
      if (kernel_kind_is_flop_rated(n)) kr.flops_per_s = r.quantity(k, "gpu.kernels", n, Dimension::flops_rate);
      else kr.bytes_per_s = r.quantity(k, "gpu.kernels", n, Dimension::bandwidth);
      p.kernels.push_back(kr);
    }
  }

  if (YAML::Node rs = gpu["reserve"]; rs.IsDefined() && !rs.IsNull()) {
    if (!rs.IsMap())
      r.fail(rs, "gpu.reserve", "expected a mapping {context: 300 MiB, workspace: 32 MiB, communicator: 128 MiB}");
    r.only_keys(rs, "gpu.reserve", {"context", "workspace", "communicator"});
    const auto most = std::uint64_t(p.gpu_memory_bytes);
    GpuReserve& g = p.gpu_reserve;
    g.context_bytes = double(r.bytes_or(rs, "gpu.reserve", "context", 0, most, 0));
    g.workspace_bytes = double(r.bytes_or(rs, "gpu.reserve", "workspace", 0, most, 0));
    g.communicator_bytes = double(r.bytes_or(rs, "gpu.reserve", "communicator", 0, most, 0));
    g.given = true;
    // a job of three groups (data, tensor and pipeline parallel) must still leave memory to train in
    if (g.context_bytes + g.workspace_bytes + 3 * g.communicator_bytes >= p.gpu_memory_bytes)
      r.fail(rs, "gpu.reserve",
             "expected context + workspace + 3 x communicator below gpu.memory (" + format_bytes(p.gpu_memory_bytes) +
                 "): nothing would be left to train in");
  }

  YAML::Node links = r.section(root, "", "links");
  r.only_keys(links, "links",
              {"gpu_gpu", "pcie_single_gpu", "pcie_aggregate", "inter_node", "inter_node_measured", "nic_attach"});
  p.gpu_gpu_Bps = p.gpus_per_node > 1 ? r.quantity(links, "links", "gpu_gpu", Dimension::bandwidth)
                                      : r.quantity_or(links, "links", "gpu_gpu", Dimension::bandwidth, 0);
  p.pcie_single_gpu_Bps = r.quantity(links, "links", "pcie_single_gpu", Dimension::bandwidth);
  p.pcie_aggregate_Bps = r.quantity(links, "links", "pcie_aggregate", Dimension::bandwidth);
  p.inter_node_Bps = p.nodes > 1 ? r.quantity(links, "links", "inter_node", Dimension::bandwidth)
                                 : r.quantity_or(links, "links", "inter_node", Dimension::bandwidth, 0);
  p.inter_node_nominal_Bps = p.inter_node_Bps;
  // what collectives measured across nodes, below the line rate (the NICs share PCIe with the GPUs)
  if (links["inter_node_measured"]) {
    const double measured = r.quantity(links, "links", "inter_node_measured", Dimension::bandwidth);
    if (!links["inter_node"])
      r.fail(links["inter_node_measured"], "links.inter_node_measured", "expected links.inter_node (the line rate) beside it");
    else if (measured > p.inter_node_nominal_Bps)
      r.fail(links["inter_node_measured"], "links.inter_node_measured",
             "expected at most links.inter_node (" + format_bandwidth(p.inter_node_nominal_Bps) + ")");
    else p.inter_node_Bps = measured;
  }
  const std::string nic = r.text_or(links, "links", "nic_attach", "pcie_switch");
  if (nic != "pcie_switch" && nic != "cpu")
    r.fail(links["nic_attach"], "links.nic_attach", "expected pcie_switch or cpu, got \"" + nic + "\"");
  p.nic_attach = nic == "cpu" ? NicAttach::cpu : NicAttach::pcie_switch;
  if (p.pcie_aggregate_Bps < p.pcie_single_gpu_Bps)
    r.fail(links["pcie_aggregate"], "links.pcie_aggregate",
           "expected at least links.pcie_single_gpu (the node's PCIe root carries at least one GPU's traffic)");

  YAML::Node cpu = r.section(root, "", "cpu");
  r.only_keys(cpu, "cpu", {"memory", "memory_bandwidth", "adam_throughput", "pinned_budget"});
  p.cpu_memory_bytes = r.quantity(cpu, "cpu", "memory", Dimension::bytes);
  p.cpu_memory_Bps = r.quantity(cpu, "cpu", "memory_bandwidth", Dimension::bandwidth);
  p.cpu_adam_params_per_s = r.quantity(cpu, "cpu", "adam_throughput", Dimension::param_rate);
  p.pinned_budget_bytes = r.quantity(cpu, "cpu", "pinned_budget", Dimension::bytes);
  if (p.pinned_budget_bytes > p.cpu_memory_bytes)
    r.fail(cpu["pinned_budget"], "cpu.pinned_budget", "expected at most cpu.memory");

  YAML::Node nvme = r.section(root, "", "nvme");
  r.only_keys(nvme, "nvme", {"capacity", "read", "write"});
  p.nvme_capacity_bytes = r.quantity(nvme, "nvme", "capacity", Dimension::bytes);
  p.nvme_read_Bps = r.quantity(nvme, "nvme", "read", Dimension::bandwidth);
  p.nvme_write_Bps = r.quantity(nvme, "nvme", "write", Dimension::bandwidth);

  if (YAML::Node ex = root["executor"]; ex.IsDefined()) {
    if (!ex.IsMap()) r.fail(ex, "executor", "expected a mapping with backend (cpu or cuda) and precision");
    r.only_keys(ex, "executor", {"backend", "precision"});
    p.executor_backend = r.text(ex, "executor", "backend");
    if (p.executor_backend != "cpu" && p.executor_backend != "cuda")
      r.fail(ex["backend"], "executor.backend", "expected cpu or cuda, got \"" + p.executor_backend + "\"");
    p.executor_precision = r.text_or(ex, "executor", "precision", "bf16");
    if (p.executor_precision != "bf16" && p.executor_precision != "fp16" && p.executor_precision != "fp32")
      r.fail(ex["precision"], "executor.precision", "expected bf16, fp16 or fp32, got \"" + p.executor_precision + "\"");
  }
  return p;
}

}  // namespace

Result<HardwareProfile> parse_profile(std::string_view yaml_text, const std::string& source) {
  try {
    YamlReader reader(source, yaml_text);
    HardwareProfile p = read_profile(reader);
    p.source = source;
    return p;
  } catch (const InputError& e) {
    return make_error(e.what());
  } catch (const YAML::Exception& e) {
    return make_error(source + ": " + e.what());
  }
}

Result<HardwareProfile> load_profile(const std::string& name_or_path) {
  if (auto text = builtin_profile_yaml(name_or_path)) return parse_profile(*text, "builtin:" + name_or_path);
  for (const auto& n : builtin_profile_names())  // built-in names are case-insensitive: DGX-A100 is dgx-a100
    if (lower_ascii(n) == lower_ascii(name_or_path))
      if (auto text = builtin_profile_yaml(n)) return parse_profile(*text, "builtin:" + n);
  Result<std::string> text = read_input_file(name_or_path, "profile");
  if (!text) {
    std::error_code ec;
    if (name_or_path.empty() ||
        std::filesystem::symlink_status(name_or_path, ec).type() != std::filesystem::file_type::not_found)
      return make_error(text.error());
    std::string names;
    for (const auto& n : builtin_profile_names()) names += (names.empty() ? "" : ", ") + n;
    std::string near = did_you_mean(name_or_path, builtin_profile_names());
    near = near.empty() ? " (" : near.substr(0, near.size() - 1) + "; ";
    return make_error(name_or_path + ": no such profile file, and not a built-in profile" + near + "built-in: " + names + ")");
  }
  return parse_profile(*text, name_or_path);
}

Result<HardwareProfile> scale_to_nodes(const HardwareProfile& profile, int nodes) {
  if (nodes < 1 || nodes > kMaxNodes)
    return make_error("--nodes: expected an integer from 1 to " + std::to_string(kMaxNodes) + ", got " +
                      std::to_string(nodes));
  if (nodes > 1 && profile.inter_node_Bps <= 0)
    return make_error(profile.source + ": links.inter_node: missing field (needed to scale the profile to " +
                      std::to_string(nodes) + " nodes)");
  HardwareProfile scaled = profile;
  scaled.nodes = nodes;
  return scaled;
}

}  // namespace memwall
