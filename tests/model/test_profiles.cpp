// Hardware profiles: every shipped profile loads and says what the paper (or its datasheet) says;
// broken profiles are refused with file, line, field and what was expected.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "model/hardware_profile.hpp"
#include "model/operator_graph.hpp"

namespace memwall {
namespace {

TEST(Profiles, EveryShippedProfileLoadsFromFileAndEmbedded) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(MEMWALL_SOURCE_DIR "/hardware_profiles")) {
    Result<HardwareProfile> from_file = load_profile(entry.path().string());
    ASSERT_TRUE(from_file.ok()) << from_file.error();
    Result<HardwareProfile> embedded = load_profile(entry.path().stem().string());
    ASSERT_TRUE(embedded.ok()) << entry.path() << " is not embedded: " << embedded.error();
    EXPECT_EQ(from_file->name, entry.path().stem().string()) << "name field must match the file name";
    EXPECT_EQ(from_file->gpu_memory_bytes, embedded->gpu_memory_bytes);
    ++n;
  }
  EXPECT_GE(n, 5);
  for (const char* required : {"dgx2", "dgx-a100", "dgx-h100", "gh200", "workstation"})
    EXPECT_TRUE(load_profile(required).ok()) << required;
}

TEST(Profiles, Dgx2HasThePapersNumbers) {
  Result<HardwareProfile> r = load_profile("dgx2");
  ASSERT_TRUE(r.ok()) << r.error();
  const HardwareProfile& p = *r;
  EXPECT_EQ(p.gpus_per_node, 16);
  EXPECT_DOUBLE_EQ(p.gpu_memory_bytes, 32.0 * (1 << 30));
  EXPECT_DOUBLE_EQ(p.gpu_gpu_Bps, 70e9);
  EXPECT_DOUBLE_EQ(p.pcie_single_gpu_Bps, 12e9);
  EXPECT_DOUBLE_EQ(p.cpu_memory_bytes, 1.5e12);
  EXPECT_DOUBLE_EQ(p.cpu_memory_Bps, 100e9);
  EXPECT_DOUBLE_EQ(p.nvme_read_Bps, 25e9);
  EXPECT_DOUBLE_EQ(p.inter_node_nominal_Bps, 100e9);  // 800 Gbps, Sec. 8.1
  EXPECT_DOUBLE_EQ(p.inter_node_Bps, 82.5e9);          // 660 Gbps measured (Megatron-DeepSpeed)
  // Fig. 2b / Sec. 6.1: 3.0 GB/s per GPU to CPU memory and ~1.6 GB/s per GPU from NVMe, 16 at once.
  EXPECT_DOUBLE_EQ(p.cpu_Bps_per_gpu_all_active(), 3.0e9);
  EXPECT_NEAR(p.nvme_read_Bps_per_gpu_all_active(), 1.6e9, 0.05e9);
  // Sec. 4.2: 62-78 TFLOPS for hidden 8K-64K, flat outside.
  EXPECT_DOUBLE_EQ(p.peak_flops_per_s(8192), 62e12);
  EXPECT_DOUBLE_EQ(p.peak_flops_per_s(65536), 78e12);
  EXPECT_DOUBLE_EQ(p.peak_flops_per_s(1024), 62e12);
  EXPECT_DOUBLE_EQ(p.peak_flops_per_s(163840), 78e12);
  double mid = p.peak_flops_per_s(23170);  // between 16K and 32K
  EXPECT_GT(mid, 62e12);
  EXPECT_LT(mid, 78e12);
}

TEST(Profiles, NodesScaleTheCluster) {
  HardwareProfile p = *load_profile("dgx2");
  Result<HardwareProfile> c = scale_to_nodes(p, 32);
  ASSERT_TRUE(c.ok()) << c.error();
  EXPECT_EQ(c->total_gpus(), 512);
  EXPECT_EQ(load_profile("dgx2-superpod")->total_gpus(), 512);
  EXPECT_FALSE(scale_to_nodes(p, 0).ok());
  HardwareProfile lone = *load_profile("workstation");
  lone.inter_node_Bps = 0;
  Result<HardwareProfile> bad = scale_to_nodes(lone, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("links.inter_node"), std::string::npos) << bad.error();
}

const char* kGood = R"(name: t
nodes: 1
gpu:
  count_per_node: 2
  memory: 16 GiB
  peak: 10 TFLOPS
links:
  gpu_gpu: 50 GB/s
  pcie_single_gpu: 10 GB/s
  pcie_aggregate: 16 GB/s
cpu:
  memory: 64 GB
  memory_bandwidth: 40 GB/s
  adam_throughput: 1 G params/s
  pinned_budget: 8 GiB
nvme:
  capacity: 1 TB
  read: 3 GB/s
  write: 2 GB/s
)";

std::string replace(std::string s, const std::string& from, const std::string& to) {
  size_t at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

// kGood with `lines` added to its gpu section, after gpu.peak.
std::string with_gpu(const std::string& lines) { return replace(kGood, "  peak: 10 TFLOPS\n", "  peak: 10 TFLOPS\n" + lines); }

struct BadCase {
  std::string yaml;
  std::string expect;  // substring of the one-line error
};

TEST(Profiles, BadProfilesNameFileLineAndField) {
  ASSERT_TRUE(parse_profile(kGood, "t.yaml").ok()) << parse_profile(kGood, "t.yaml").error();
  std::vector<BadCase> cases = {
      {replace(kGood, "memory: 16 GiB", "memory: 16"), "t.yaml:5: gpu.memory: expected a size with a unit"},
      {replace(kGood, "gpu_gpu: 50 GB/s", "gpu_gpu: 0 GB/s"), "t.yaml:8: links.gpu_gpu: expected a positive value"},
      {replace(kGood, "read: 3 GB/s", "read: -3 GB/s"), "t.yaml:18: nvme.read: expected a positive value"},
      {replace(kGood, "  peak: 10 TFLOPS\n", ""), "gpu.peak: missing field"},
      {replace(kGood, "  write: 2 GB/s\n", "  write: 2 GB/s\n  speed: 9 GB/s\n"), "t.yaml:20: nvme.speed: unknown field"},
      {replace(kGood, "count_per_node: 2", "count_per_node: two"), "t.yaml:4: gpu.count_per_node: expected an integer from 1 to 1024, got \"two\""},
      {replace(kGood, "peak: 10 TFLOPS", "peak: 10 GB/s"), "gpu.peak: expected a compute rate"},
      {replace(kGood, "gpu:\n", "gpu: [\n"), "t.yaml"},
      {replace(kGood, "pcie_aggregate: 16 GB/s", "pcie_aggregate: 5 GB/s"), "links.pcie_aggregate: expected at least"},
      {replace(kGood, "pinned_budget: 8 GiB", "pinned_budget: 80 GiB"), "cpu.pinned_budget: expected at most cpu.memory"},
      {replace(kGood, "nodes: 1", "nodes: 2"), "links.inter_node: missing field"},
      {replace(kGood, "pcie_aggregate: 16 GB/s", "pcie_aggregate: 16 GB/s\n  inter_node_measured: 90 Gbps"),
       "t.yaml:11: links.inter_node_measured: expected links.inter_node (the line rate) beside it"},
      {replace(kGood, "pcie_aggregate: 16 GB/s", "pcie_aggregate: 16 GB/s\n  inter_node: 100 Gbps\n  inter_node_measured: 200 Gbps"),
       "t.yaml:12: links.inter_node_measured: expected at most links.inter_node (12.5 GB/s)"},
      {"- just\n- a list\n", "t.yaml:1: expected a YAML mapping"},
      // gpu.kernels (memwall calibrate): FLOP rates for the attention products and the LM head,
      // byte rates for the memory-bound kinds, nothing else
      {with_gpu("  kernels:\n    gelu: 5 TFLOPS\n"),
       "t.yaml:8: gpu.kernels.gelu: expected a bandwidth"},
      {with_gpu("  kernels:\n    attention_scores: 5 GB/s\n"),
       "gpu.kernels.attention_scores: expected a compute rate"},
      {with_gpu("  kernels:\n    linear: 5 TFLOPS\n"),
       "gpu.kernels.linear: unknown field (expected one of: embedding, layernorm"},
      {with_gpu("  kernels: 3\n"), "gpu.kernels: expected a mapping"},
      {with_gpu("  kernels:\n    gelu: 0 GB/s\n"),
       "gpu.kernels.gelu: expected a positive value"},
      // gpu.reserve: whole bytes with a unit, known parts only, and room left to train in
      {with_gpu("  reserve:\n    context: 300\n"),
       "t.yaml:8: gpu.reserve.context: expected"},
      {with_gpu("  reserve:\n    fragmentation: 5 %\n"),
       "t.yaml:8: gpu.reserve.fragmentation: unknown field (expected one of: context, workspace, communicator"},
      {with_gpu("  reserve: 1 GiB\n"), "t.yaml:7: gpu.reserve: expected a mapping"},
      {with_gpu("  reserve:\n    context: 15 GiB\n    communicator: 400 MiB\n"),
       "t.yaml:8: gpu.reserve: expected context + workspace + 3 x communicator below gpu.memory (16.0 GiB)"},
      {with_gpu("  reserve:\n    workspace: 17 GiB\n"),
       "gpu.reserve.workspace: expected"},
      {with_gpu("  shared_peak: 5 GB/s\n"),
       "t.yaml:7: gpu.shared_peak: expected a compute rate"},
      {with_gpu("  gemm:\n    - {m: 512, n: 64, k: 256}\n"),
       "t.yaml:8: gpu.gemm[0].rate: missing field"},
      {with_gpu("  gemm:\n    - {m: 0, n: 64, k: 256, rate: 1 TFLOPS}\n"),
       "gpu.gemm[0].m: expected an integer from 1"},
      {with_gpu("  gemm: 5\n"), "t.yaml:7: gpu.gemm: expected a list"},
  };
  for (const auto& c : cases) {
    Result<HardwareProfile> r = parse_profile(c.yaml, "t.yaml");
    ASSERT_FALSE(r.ok()) << "accepted:\n" << c.yaml;
    EXPECT_NE(r.error().find(c.expect), std::string::npos) << "got: " << r.error() << "\nwanted: " << c.expect;
    EXPECT_EQ(r.error().find('\n'), std::string::npos) << "not one line: " << r.error();
  }
}

// gpu.reserve (issue 28 item 4): every GPU profile shipped names what CUDA, cuBLAS and NCCL keep, each
// part with its source in the YAML; local-cpu's device is host memory and keeps none.
TEST(Profiles, GpuProfilesReserveWhatTheSoftwareStackKeeps) {
  for (const char* name : {"dgx2", "dgx2-superpod", "dgx-a100", "dgx-h100", "gh200", "workstation"}) {
    const HardwareProfile p = *load_profile(name);
    EXPECT_TRUE(p.gpu_reserve.given) << name;
    EXPECT_GT(p.gpu_reserve.context_bytes, 100.0 * (1 << 20)) << name;
    EXPECT_GE(p.gpu_reserve.workspace_bytes, 4.0 * (1 << 20)) << name;
    EXPECT_GT(p.gpu_reserve.communicator_bytes, 0) << name;
  }
  // cuBLAS recommends 32 MiB on Hopper, 4 MiB before; eager module loading (the paper's V100 runs)
  // costs more context than lazy loading
  EXPECT_DOUBLE_EQ(load_profile("dgx-h100")->gpu_reserve.workspace_bytes, 32.0 * (1 << 20));
  EXPECT_DOUBLE_EQ(load_profile("dgx-a100")->gpu_reserve.workspace_bytes, 4.0 * (1 << 20));
  EXPECT_GT(load_profile("dgx2")->gpu_reserve.context_bytes, load_profile("dgx-h100")->gpu_reserve.context_bytes);
  const HardwareProfile cpu = *load_profile("local-cpu");
  EXPECT_FALSE(cpu.gpu_reserve.given);
  EXPECT_EQ(cpu.gpu_reserve.context_bytes + cpu.gpu_reserve.workspace_bytes + cpu.gpu_reserve.communicator_bytes, 0);
  Result<HardwareProfile> r = parse_profile(
      with_gpu("  reserve:\n    context: 300 MiB\n    workspace: 0 B\n    communicator: 64 MiB\n"),
      "t.yaml");
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_DOUBLE_EQ(r->gpu_reserve.context_bytes, 300.0 * (1 << 20));
  EXPECT_EQ(r->gpu_reserve.workspace_bytes, 0);
  EXPECT_DOUBLE_EQ(r->gpu_reserve.communicator_bytes, 64.0 * (1 << 20));
  Result<HardwareProfile> shared = parse_profile(with_gpu("  shared_peak: 15 TFLOPS\n"), "t.yaml");
  ASSERT_TRUE(shared.ok()) << shared.error();
  EXPECT_DOUBLE_EQ(shared->gpu_shared_peak_flops_per_s, 15e12);
  EXPECT_EQ(load_profile("dgx2")->gpu_shared_peak_flops_per_s, 0);
}

// gpu.gemm (issue 28 item 2): measured rates by GEMM shape; a shape is costed at the measured
// point nearest in log(m), log(n), log(k), its own where it was measured.
TEST(Profiles, GemmRateIsTheNearestMeasuredShape) {
  Result<HardwareProfile> r = parse_profile(
      with_gpu("  gemm:\n    - {m: 512, n: 1024, k: 256, rate: 8 TFLOPS}\n"
              "    - {m: 512, n: 256, k: 256, rate: 6 TFLOPS}\n    - {m: 512, n: 64, k: 256, rate: 3 TFLOPS}\n"),
      "t.yaml");
  ASSERT_TRUE(r.ok()) << r.error();
  ASSERT_EQ(r->gemm.size(), 3u);
  EXPECT_DOUBLE_EQ(r->gemm_rate(512, 256, 256), 6e12);
  EXPECT_DOUBLE_EQ(r->gemm_rate(512, 64, 256), 3e12);
  EXPECT_DOUBLE_EQ(r->gemm_rate(512, 900, 256), 8e12);  // nearest in log space
  EXPECT_DOUBLE_EQ(r->gemm_rate(512, 100, 256), 3e12);  // log(100/64) < log(256/100)
  EXPECT_EQ(load_profile("dgx2")->gemm_rate(512, 256, 256), 0);  // none measured
  // the shapes: tiling splits a layer's outputs, tensor slicing the columns of qkv and fc1 and the
  // rows of proj and fc2
  const ModelSpec gpt_shape = *model_from_shape(2, 1024, 16);
  const GemmShape fc1 = linear_gemm_shape(gpt_shape, OpRole::fc1, 2048, 2, 4);
  EXPECT_EQ(fc1.m, 2048);
  EXPECT_EQ(fc1.n, 4 * 1024 / 2 / 4);
  EXPECT_EQ(fc1.k, 1024);
  const GemmShape fc2 = linear_gemm_shape(gpt_shape, OpRole::fc2, 2048, 2, 4);
  EXPECT_EQ(fc2.n, 1024 / 4);
  EXPECT_EQ(fc2.k, 4 * 1024 / 2);
  EXPECT_EQ(linear_gemm_shape(gpt_shape, OpRole::qkv, 8).n, 3 * 1024);
  EXPECT_EQ(linear_gemm_shape(gpt_shape, OpRole::gelu, 8).m, 0);
}

// Datasheet profiles (gpu.sms, a flat gpu.peak): NVIDIA's tile and wave quantization (256 x 128
// output tiles, one per SM per wave) and the HBM roofline, in closed form.
TEST(Profiles, DatasheetGemmModelQuantizesTilesAndWavesAndIsBoundByMemory) {
  const double peak = 200e12, hbm = 2039e9;
  const int sms = 108;
  // 108 whole tiles: one full wave, the peak exactly
  const long m = 256L * 108, n = 128, k = 4096;
  EXPECT_DOUBLE_EQ(datasheet_gemm_seconds(m, n, k, sms, peak, hbm), 2.0 * m * n * k / peak);
  // one tile more: a second wave for it, twice the time
  EXPECT_DOUBLE_EQ(datasheet_gemm_seconds(m + 1, n, k, sms, peak, hbm), 2 * 2.0 * m * n * k / peak);
  // a partial tile costs a whole one: half of each tile's rows cost the same as the whole rows
  EXPECT_DOUBLE_EQ(datasheet_gemm_seconds(128L * 108, n, k, sms, peak, hbm), 2.0 * m * n * k / peak);
  // a thin GEMM (k 8) moves more bytes than it computes: the roofline
  EXPECT_DOUBLE_EQ(datasheet_gemm_seconds(m, n, 8, sms, peak, hbm), 2.0 * (m * 8.0 + 8.0 * n + double(m) * n) / hbm);
  EXPECT_EQ(datasheet_gemm_seconds(m, n, k, 0, peak, hbm), 0);

  // the profiles: forward and backward together, the three GEMMs; the same shape measured wins
  const HardwareProfile a100 = *load_profile("dgx-a100");
  ASSERT_EQ(a100.gpu_sms, 108);
  const double t = datasheet_gemm_seconds(m, n, k, 108, 200e12, a100.gpu_memory_Bps) +
                   datasheet_gemm_seconds(m, k, n, 108, 200e12, a100.gpu_memory_Bps) +
                   datasheet_gemm_seconds(n, k, m, 108, 200e12, a100.gpu_memory_Bps);
  EXPECT_DOUBLE_EQ(a100.gemm_rate(m, n, k), 3 * 2.0 * m * n * k / t);
  // a 10B layer's fc1 at 2048 tokens: whole, it fills the GPU; sliced 8 ways, its thinner GEMMs
  // leave SMs idle in the last wave and reach a smaller share of the peak
  const ModelSpec ten_b = *load_model("table1-10B");
  const GemmShape whole = linear_gemm_shape(ten_b, OpRole::fc1, 2048, 1, 1), sliced = linear_gemm_shape(ten_b, OpRole::fc1, 2048, 8, 1);
  EXPECT_GT(a100.gemm_rate(whole.m, whole.n, whole.k), 0.9 * 200e12);
  EXPECT_LT(a100.gemm_rate(sliced.m, sliced.n, sliced.k), 0.9 * a100.gemm_rate(whole.m, whole.n, whole.k));
  // the paper's profile keeps its measured peak by hidden size; none of its shapes is modelled
  EXPECT_EQ(load_profile("dgx2")->gpu_sms, 0);
  HardwareProfile measured = a100;
  measured.gemm = {{whole.m, whole.n, whole.k, 123e12}};
  EXPECT_DOUBLE_EQ(measured.gemm_rate(sliced.m, sliced.n, sliced.k), 123e12);
}

TEST(Profiles, KernelRatesKeepTheirDimension) {
  const std::string yaml = with_gpu("  kernels:\n    gelu: 2 GB/s\n    lm_head: 3 TFLOPS\n");
  Result<HardwareProfile> r = parse_profile(yaml, "t.yaml");
  ASSERT_TRUE(r.ok()) << r.error();
  ASSERT_NE(r->kernel("gelu"), nullptr);
  EXPECT_DOUBLE_EQ(r->kernel("gelu")->bytes_per_s, 2e9);
  EXPECT_EQ(r->kernel("gelu")->flops_per_s, 0);
  EXPECT_DOUBLE_EQ(r->kernel("lm_head")->flops_per_s, 3e12);
  EXPECT_EQ(r->kernel("layernorm"), nullptr);  // not given: the roofline of gpu.peak and memory_bandwidth
}

TEST(Profiles, UnknownNameListsBuiltins) {
  Result<HardwareProfile> r = load_profile("dgx3");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("dgx2"), std::string::npos) << r.error();
}

}  // namespace
}  // namespace memwall
