#include "model/throughput.hpp"

#include <array>
#include <cmath>

#include "model/analysis.hpp"
#include "model/operator_graph.hpp"
#include "model/units.hpp"

namespace memwall {


namespace {
// PaLM's count for `params` parameters (model_params, built once per report: it walks the graph)
double palm_flops_per_sample(const ModelSpec& m, long seq, double params) {
  const double T = double(seq);
  return T * (6.0 * params + 12.0 * m.layers * double(m.hidden) * T);
}
}  // namespace

// PaLM's N: the parameters a token passes through (every one but a mixture of experts' unrouted)
double model_flops_per_sample(const ModelSpec& m, long seq) {
  return palm_flops_per_sample(m, seq, active_param_count(m));
}

double default_train_tokens(const ModelSpec& m) { return kChinchillaTokensPerParam * model_param_count(m); }

double gpu_datasheet_peak(std::string_view name) {
  struct Gpu {
    std::string_view part;  // a substring of the name; the first that matches wins
    double flops_per_s;
  };
  // NVIDIA datasheets, dense BF16/FP16 tensor throughput (half the "with sparsity" figures)
  static constexpr std::array<Gpu, 12> kGpus{{
      {"H100 PCIe", 756.5e12},    // H100 PCIe
      {"H100 NVL", 835.5e12},     // H100 NVL
      {"H100", 989.4e12},         // H100 SXM ("NVIDIA H100 80GB HBM3")
      {"H200", 989.4e12},         // H200 SXM
      {"GH200", 989.4e12},        // GH200 Grace Hopper
      {"H800", 989.4e12},         // H800 SXM
      {"A100", 312e12},           // A100 SXM4 and PCIe
      {"A800", 312e12},           // A800
      {"L40S", 362.05e12},        // L40S
      {"RTX 4090", 165.2e12},     // Ada white paper: FP16 tensor with FP32 accumulate
      {"V100-PCIE", 112e12},      // V100 PCIe
      {"V100", 125e12},           // V100 SXM2
  }};
  for (const Gpu& g : kGpus)
    if (name.find(g.part) != std::string_view::npos) return g.flops_per_s;
  return 0;
}

Throughput throughput(const ModelSpec& m, const TrainingConfig& c, const HardwareProfile& profile,
                      double iteration_s, double hardware_flops_per_gpu, double train_tokens, std::string_view device) {
  Throughput t;
  t.iteration_s = iteration_s;
  t.gpus = std::max(1, c.dp) * c.mp * c.pp;
  t.samples_per_step = global_batch(c);
  t.tokens_per_step = t.samples_per_step * double(c.seq);
  if (const double d = device.empty() ? 0 : gpu_datasheet_peak(device); d > 0) {
    t.datasheet_peak = true;
    t.peak_flops_per_s = d;
    t.peak_source = "datasheet of " + std::string(device);
  } else {
    t.datasheet_peak = profile.gpu_datasheet_peak_flops_per_s > 0;
    t.peak_flops_per_s = t.datasheet_peak ? profile.gpu_datasheet_peak_flops_per_s : profile.gpu_peak_flops_per_s;
    t.peak_source = t.datasheet_peak ? "gpu.datasheet_peak" : "gpu.peak";
  }
  const double params = model_param_count(m);
  t.train_tokens_default = train_tokens <= 0;
  t.train_tokens = t.train_tokens_default ? kChinchillaTokensPerParam * params : train_tokens;
  if (iteration_s <= 0) return t;
  t.tokens_per_s = t.tokens_per_step / iteration_s;
  t.tokens_per_s_per_gpu = t.tokens_per_s / t.gpus;
  t.model_flops_per_s_per_gpu = t.samples_per_step * palm_flops_per_sample(m, c.seq, active_param_count(m)) / iteration_s / t.gpus;
  t.hardware_flops_per_s_per_gpu = hardware_flops_per_gpu / iteration_s;
  if (t.peak_flops_per_s > 0) {
    t.mfu = t.model_flops_per_s_per_gpu / t.peak_flops_per_s;
    t.hfu = t.hardware_flops_per_s_per_gpu / t.peak_flops_per_s;
  }
  t.train_s = t.tokens_per_s > 0 ? t.train_tokens / t.tokens_per_s : 0;
  return t;
}

std::string format_duration(double seconds) {
  struct Unit {
    double s;
    const char* name;
  };
  static constexpr std::array<Unit, 5> kUnits{
      {{365.25 * 86400, "years"}, {86400, "days"}, {3600, "h"}, {60, "min"}, {1, "s"}}};
  if (!std::isfinite(seconds)) return "never";
  for (const Unit& u : kUnits)
    if (seconds >= u.s) return format_sig(seconds / u.s) + " " + u.name;
  return format_sig(seconds) + " s";
}

std::string throughput_words(const Throughput& t) {
  std::string s = format_count(t.tokens_per_s) + " tokens/s (" + format_count(t.tokens_per_s_per_gpu) +
                  " per GPU), MFU " + format_sig(100 * t.mfu) + " %, HFU " + format_sig(100 * t.hfu) + " % of " +
                  format_flops_rate(t.peak_flops_per_s) +
                  (t.peak_source == "gpu.datasheet_peak" ? " (datasheet)"
                   : t.datasheet_peak                    ? " (" + t.peak_source + ")"
                                                         : " (gpu.peak; no datasheet_peak)");
  s += "; " + format_count(t.train_tokens) + " tokens";
  if (t.train_tokens_default) s += " (20 per parameter)";
  s += " in " + (t.train_s > 0 ? format_duration(t.train_s) : std::string("never"));
  return s;
}

}  // namespace memwall
