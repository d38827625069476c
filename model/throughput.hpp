// Throughput and utilisation of a training iteration, defined once (results/METRICS.md,
// "Throughput and utilisation"): tokens per second, model FLOPs utilisation (MFU, PaLM's), hardware
// FLOPs utilisation (HFU: the FLOPs computed, activation recompute included) and the time to train a
// number of tokens. analyze, simulate, plan, run and validate all report these from here; each
// passes the iteration time it has (predicted, replayed or measured) and the FLOPs it computed.
#pragma once

#include <string>
#include <string_view>

#include "model/hardware_profile.hpp"
#include "model/model_spec.hpp"
#include "model/training_config.hpp"

namespace memwall {

// Model FLOPs of one sample of `seq` tokens, forward and backward, no recompute (PaLM, Chowdhery et
// al. 2022, appendix B): seq · (6·N + 12·L·C·seq), N = model_param_count(m) (model/analysis.hpp:
// every parameter, the tied embedding once), active_param_count for a mixture of experts. 12·L·C·seq: the two
// attention products (scores and context), forward and backward, over the full square.
double model_flops_per_sample(const ModelSpec& m, long seq);

// Tokens a run trains when the user names none: 20 per parameter, the compute-optimal budget of
// Hoffmann et al. 2022 ("Chinchilla", Table 3).
inline constexpr double kChinchillaTokensPerParam = 20;
double default_train_tokens(const ModelSpec& m);

struct Throughput {
  double iteration_s = 0;
  int gpus = 0;                    // dp x mp x pp
  double samples_per_step = 0;     // global batch: bsz x grad_accum x dp
  double tokens_per_step = 0;      // samples_per_step x seq
  double tokens_per_s = 0;         // over all GPUs
  double tokens_per_s_per_gpu = 0;
  double model_flops_per_s_per_gpu = 0;     // model FLOPs of a step / (iteration_s x gpus)
  double hardware_flops_per_s_per_gpu = 0;  // the FLOPs computed (recompute included) / (iteration_s x gpus)
  double peak_flops_per_s = 0;     // what MFU and HFU divide by
  bool datasheet_peak = false;     // true: a datasheet's (the device's or gpu.datasheet_peak); false: gpu.peak
  std::string peak_source;         // "gpu.datasheet_peak", "gpu.peak" or "datasheet of <device>"
  double mfu = 0;                  // model_flops_per_s_per_gpu / peak_flops_per_s
  double hfu = 0;                  // hardware_flops_per_s_per_gpu / peak_flops_per_s
  double train_tokens = 0;         // tokens the time below trains
  bool train_tokens_default = false;  // train_tokens is default_train_tokens (the user named none)
  double train_s = 0;              // train_tokens / tokens_per_s
};

// `config` with dp resolved (fit_to_profile); `hardware_flops_per_gpu`: the FLOPs one GPU computes
// in one iteration (all micro-steps), as the caller counted them: Eq. 7-8 in analyze and plan, the
// schedule's compute steps in simulate, run and validate. `train_tokens` 0: default_train_tokens.
// `device`: the GPU that ran it as CUDA names it (executed runs on cuda); its datasheet peak, when
// known, is what MFU and HFU divide by, whatever the profile says.
Throughput throughput(const ModelSpec& m, const TrainingConfig& config, const HardwareProfile& profile,
                      double iteration_s, double hardware_flops_per_gpu, double train_tokens = 0,
                      std::string_view device = {});

// The dense 16-bit tensor-core peak of a GPU as CUDA names it ("NVIDIA H100 80GB HBM3", "Tesla
// V100-SXM2-32GB"), from NVIDIA's datasheets (no sparsity); 0 when the name is not known.
double gpu_datasheet_peak(std::string_view device_name);

// "3.2 days", "41.0 min", "12.5 s", "2.10 years": three significant digits in the largest unit
// that keeps the number at least 1 (s, min, h, days, years of 365.25 days).
std::string format_duration(double seconds);

// One line for people: "12.3 k tokens/s (768 per GPU), MFU 41.2 %, HFU 54.9 % of 125 TFLOPS
// (datasheet); 20 tokens per parameter (200 B tokens) in 3.20 days".
std::string throughput_words(const Throughput& t);

}  // namespace memwall
