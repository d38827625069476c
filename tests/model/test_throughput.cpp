// Throughput and utilisation (model/throughput.hpp, results/METRICS.md): the parameter count against
// GPT-2's published one, the model FLOPs against PaLM's and Megatron-LM's counts, and the metrics
// of a step against their definitions.
#include <cmath>

#include <gtest/gtest.h>

#include "model/analysis.hpp"
#include "model/hardware_profile.hpp"
#include "model/model_spec.hpp"
#include "model/operator_graph.hpp"
#include "model/throughput.hpp"

namespace memwall {
namespace {

// GPT-2 small (Radford et al. 2019): 12 layers, 768 channels, 12 heads, 1024 positions, 50257
// tokens, tied embedding: 124,439,808 parameters (Hugging Face's GPT2LMHeadModel.num_parameters()).
TEST(Throughput, ParamsOfGpt2SmallArePublished) {
  const ModelSpec m = *model_from_shape(12, 768, 12, 1024, 50257);
  EXPECT_DOUBLE_EQ(model_param_count(m), 124439808.0);
}

// PaLM's 6N + 12 L C T per token, and the operator graph's own forward and backward FLOPs of the
// matrix products (linear layers, attention products, LM head): the same count up to the few
// parameters without a product (biases, norms, positions), which 6N counts and the graph does not.
TEST(Throughput, ModelFlopsAreThePalmCountAndTheGraphsProducts) {
  const ModelSpec m = *model_from_shape(24, 2048, 16, 2048, 50257);
  const double N = model_param_count(m), T = 2048, L = 24, C = 2048;
  EXPECT_DOUBLE_EQ(model_flops_per_sample(m, 2048), T * (6 * N + 12 * L * C * T));
  const OperatorGraph g = build_gpt_graph(m, 1, 2048);
  double products = 0;
  for (size_t v = 0; v < g.size(); ++v) {
    const Operator& o = g.op(v);
    if (o.kind == OpKind::linear || o.kind == OpKind::lm_head || o.kind == OpKind::attention_scores ||
        o.kind == OpKind::attention_context)
      products += o.fwd_flops + o.bwd_flops;
  }
  EXPECT_NEAR(products / model_flops_per_sample(m, 2048), 1.0, 0.005);
  EXPECT_LT(products, model_flops_per_sample(m, 2048));
}

// Megatron-LM's count with full recompute (Narayanan et al. 2021, appendix: 96 B s l h^2 (1 + s/6h
// + V/16lh)) is the model FLOPs plus each block's forward again (2 x 12 l h^2 s + 4 l h s^2).
TEST(Throughput, MegatronCountIsModelFlopsPlusRecompute) {
  for (const ModelSpec& m : {*model_from_shape(96, 12288, 96, 2048, 51200), *model_from_shape(40, 5120, 40, 2048, 51200)}) {
    const double s = double(m.seq), l = m.layers, h = double(m.hidden), V = double(m.vocab);
    const double megatron = 96 * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
    const double recompute = 2 * 12 * l * h * h * s + 4 * l * h * s * s;
    EXPECT_NEAR((model_flops_per_sample(m, m.seq) + recompute) / megatron, 1.0, 0.002) << m.layers;
  }
}

TEST(Throughput, MetricsOfAStepFollowTheirDefinitions) {
  const HardwareProfile p = *load_profile("dgx2");
  const ModelSpec m = *model_from_shape(40, 8192, 64, 1024);
  TrainingConfig c;
  c.bsz = 4;
  c.seq = 1024;
  c.dp = 8;
  c.mp = 2;
  c.grad_accum = 3;
  const double hw = computation_flops_eq7(c.bsz, c.seq, params_eq1(m.layers, m.hidden)) * c.grad_accum;
  const Throughput t = throughput(m, c, p, 12.5, hw, 3e11);
  EXPECT_EQ(t.gpus, 16);
  EXPECT_DOUBLE_EQ(t.samples_per_step, 4.0 * 3 * 8);
  EXPECT_DOUBLE_EQ(t.tokens_per_s, 96.0 * 1024 / 12.5);
  EXPECT_DOUBLE_EQ(t.tokens_per_s_per_gpu, t.tokens_per_s / 16);
  EXPECT_TRUE(t.datasheet_peak);
  EXPECT_DOUBLE_EQ(t.peak_flops_per_s, 125e12);
  EXPECT_NEAR(t.mfu, 96 * model_flops_per_sample(m, 1024) / 16 / 12.5 / 125e12, 1e-12);
  EXPECT_NEAR(t.hfu, hw / 12.5 / 125e12, 1e-12);
  // Eq. 7-8 count the blocks' linear layers four times (recompute); MFU counts them three times plus
  // attention and the LM head: below HFU at this shape.
  EXPECT_LT(t.mfu, t.hfu);
  EXPECT_DOUBLE_EQ(t.train_tokens, 3e11);
  EXPECT_FALSE(t.train_tokens_default);
  EXPECT_DOUBLE_EQ(t.train_s, 3e11 / t.tokens_per_s);
  // no tokens named: 20 per parameter
  const Throughput d = throughput(m, c, p, 12.5, hw);
  EXPECT_TRUE(d.train_tokens_default);
  EXPECT_DOUBLE_EQ(d.train_tokens, 20 * model_param_count(m));
}

TEST(Throughput, WithoutADatasheetPeakMfuUsesTheAchievablePeakAndSaysSo) {
  const HardwareProfile p = *load_profile("local-cpu");
  ASSERT_EQ(p.gpu_datasheet_peak_flops_per_s, 0);
  const ModelSpec m = *model_from_shape(2, 256, 4, 64);
  TrainingConfig c;
  c.seq = 64;
  c.dp = 1;
  const Throughput t = throughput(m, c, p, 0.5, 1e9);
  EXPECT_FALSE(t.datasheet_peak);
  EXPECT_DOUBLE_EQ(t.peak_flops_per_s, p.gpu_peak_flops_per_s);
  EXPECT_NE(throughput_words(t).find("gpu.peak; no datasheet_peak"), std::string::npos);
}

// A run on a GPU divides by that GPU's datasheet peak, named as CUDA names it, whatever the profile.
TEST(Throughput, TheDevicesDatasheetPeakWinsOverTheProfile) {
  EXPECT_EQ(gpu_datasheet_peak("NVIDIA H100 80GB HBM3"), 989.4e12);
  EXPECT_EQ(gpu_datasheet_peak("NVIDIA H100 PCIe"), 756.5e12);
  EXPECT_EQ(gpu_datasheet_peak("NVIDIA H100 NVL"), 835.5e12);
  EXPECT_EQ(gpu_datasheet_peak("NVIDIA H200"), 989.4e12);
  EXPECT_EQ(gpu_datasheet_peak("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_EQ(gpu_datasheet_peak("Tesla V100-SXM2-32GB"), 125e12);
  EXPECT_EQ(gpu_datasheet_peak("Tesla V100-PCIE-32GB"), 112e12);
  EXPECT_EQ(gpu_datasheet_peak("host memory (OpenBLAS)"), 0);
  const HardwareProfile p = *load_profile("local-cpu");
  const ModelSpec m = *model_from_shape(2, 256, 4, 64);
  TrainingConfig c;
  c.seq = 64;
  c.dp = 1;
  const Throughput t = throughput(m, c, p, 0.5, 1e9, 0, "NVIDIA H100 80GB HBM3");
  EXPECT_TRUE(t.datasheet_peak);
  EXPECT_EQ(t.peak_flops_per_s, 989.4e12);
  EXPECT_EQ(t.peak_source, "datasheet of NVIDIA H100 80GB HBM3");
  EXPECT_NE(throughput_words(t).find("(datasheet of NVIDIA H100 80GB HBM3)"), std::string::npos);
  // an unknown device: the profile's peak, as without one
  const Throughput u = throughput(m, c, p, 0.5, 1e9, 0, "Some GPU");
  EXPECT_EQ(u.peak_source, "gpu.peak");
  EXPECT_EQ(u.peak_flops_per_s, p.gpu_peak_flops_per_s);
}

TEST(Throughput, NoIterationTimeGivesNoRates) {
  const HardwareProfile p = *load_profile("dgx2");
  const ModelSpec m = *model_from_shape(2, 256, 4, 64);
  TrainingConfig c;
  c.dp = 1;
  const Throughput t = throughput(m, c, p, 0, 1e9);
  EXPECT_EQ(t.tokens_per_s, 0);
  EXPECT_EQ(t.mfu, 0);
  EXPECT_EQ(t.train_s, 0);
  EXPECT_NE(throughput_words(t).find("in never"), std::string::npos);
}

TEST(Throughput, DurationsUseTheLargestUnitAtLeastOne) {
  EXPECT_EQ(format_duration(12.5), "12.5 s");
  EXPECT_EQ(format_duration(90), "1.50 min");
  EXPECT_EQ(format_duration(7200), "2.00 h");
  EXPECT_EQ(format_duration(3 * 86400), "3.00 days");
  EXPECT_EQ(format_duration(2 * 365.25 * 86400), "2.00 years");
  EXPECT_EQ(format_duration(0.25), "0.250 s");
  EXPECT_EQ(format_duration(INFINITY), "never");
}

TEST(Throughput, DatasheetPeakBelowTheAchievableIsRefused) {
  const std::string yaml =
      "name: x\ngpu:\n  count_per_node: 1\n  memory: 32 GiB\n  peak: 70 TFLOPS\n  datasheet_peak: 60 TFLOPS\n"
      "links:\n  pcie_single_gpu: 12 GB/s\n  pcie_aggregate: 12 GB/s\n"
      "cpu:\n  memory: 1 TiB\n  memory_bandwidth: 100 GB/s\n  adam_throughput: 1 G params/s\n"
      "nvme:\n  capacity: 1 TB\n  read: 1 GB/s\n  write: 1 GB/s\n";
  Result<HardwareProfile> r = parse_profile(yaml, "x.yaml");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("x.yaml:6: gpu.datasheet_peak: expected at least gpu.peak (70.0 TFLOPS)"), std::string::npos)
      << r.error();
}

}  // namespace
}  // namespace memwall
