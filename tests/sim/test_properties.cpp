// Properties of the replay that any correct model of shared resources has:
//  - a node's shared resources never carry more than their capacity over the iteration, whatever
//    the tensor slicing (before issue 14, mp 4 gave the node's NVMe four times its bandwidth and
//    table1-1T ran 4x faster at mp 4 than at mp 1 with the NVMe equally busy);
//  - doubling a resource the report shows more than 90 % busy shortens the iteration, and doubling
//    one less than 10 % busy changes it by less than 2 %;
//  - operators bound by memory (LayerNorm) take their bytes over HBM, GEMMs their FLOPs over peak;
//  - in the broadcast variant a non-owner's broadcast waits for the owner's fetch.
// Every simulation runs in a child process (simulate_isolated).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <map>
#include <ostream>

#include "sim/replay.hpp"
#include "tests/sim/sim_test_support.hpp"

namespace memwall::sim {
namespace {

using testing::dgx2;

SimReport run(const ModelSpec& m, const Placement& pl, TrainingConfig c, const HardwareProfile& p,
              SimOptions o = {}) {
  c.seq = m.seq;
  Result<SimReport> r = simulate_isolated(m, pl, c, p, o);
  EXPECT_TRUE(r.ok()) << r.error();
  if (!r) return {};
  EXPECT_FALSE(r->overflow) << r->overflow->message;
  return *r;
}

// The example: the node's NVMe moves the same optimizer bytes at every mp. At bsz 1 the
// NVMe is the bottleneck at every mp (at bsz 2, mp 1 leaves it 89 % busy and runs 5 % longer
// than mp 4).
TEST(Properties, TensorSlicingDoesNotMakeTheNodeFaster) {
  const ModelSpec m = *load_model("table1-1T");
  const Placement pl = *load_placement("zero_inf_nvme", {"act_ckpt=cpu"});
  std::map<int, double> t;
  for (int mp : {1, 4, 16}) {
    TrainingConfig c;
    c.bsz = 1;
    c.mp = mp;
    SimReport r = run(m, pl, c, dgx2());
    t[mp] = r.iteration_s;
    EXPECT_GT(r.busy_fraction["nvme"], 0.9) << "mp " << mp;
  }
  EXPECT_NEAR(t[4] / t[1], 1.0, 0.05);
  EXPECT_NEAR(t[16] / t[1], 1.0, 0.05);
}

// Bytes every GPU of a node moves over a resource of the node, against what it can carry in the
// iteration: at most 1 (plus rounding), at every mp and node count.
TEST(Properties, NodeResourcesNeverCarryMoreThanTheirCapacity) {
  const ModelSpec m = *model_from_shape(8, 8192, 64, 1024, 50257);
  const Placement pl = *preset("zero_inf_nvme");
  for (int nodes : {1, 2})
    for (int mp : {1, 2, 4, 8, 16}) {
      const HardwareProfile p = dgx2(nodes);
      TrainingConfig c;
      c.bsz = 4;
      c.mp = mp;
      c.seq = m.seq;
      SimReport r = run(m, pl, c, p);
      Schedule s = *build_schedule(m, pl, c, p);
      const double gpus = p.gpus_per_node;
      const double nvme = s.traffic_bytes[int(LinkClass::nvme_cpu)] * gpus / (p.nvme_read_Bps * r.iteration_s);
      const double pcie = s.traffic_bytes[int(LinkClass::cpu_gpu)] * gpus / (2 * p.pcie_aggregate_Bps * r.iteration_s);
      EXPECT_LE(nvme, 1.0 + 1e-6) << nodes << " node(s), mp " << mp;
      EXPECT_LE(pcie, 1.0 + 1e-6) << nodes << " node(s), mp " << mp;
      EXPECT_NEAR(r.busy_fraction["nvme"], nvme, 0.01 + 0.02 * nvme) << "the report counts what the schedule moves";
    }
}

// The profile fields behind each resource class of the report.
const std::map<std::string, std::function<void(HardwareProfile&)>>& doublers() {
  static const std::map<std::string, std::function<void(HardwareProfile&)>> d = {
      {"gpu_compute",
       [](HardwareProfile& p) {
         p.gpu_peak_flops_per_s *= 2;
         for (PeakPoint& x : p.peak_by_hidden) x.flops_per_s *= 2;
         p.gpu_memory_Bps *= 2;
       }},
      {"pcie", [](HardwareProfile& p) { p.pcie_single_gpu_Bps *= 2; }},
      {"pcie_root", [](HardwareProfile& p) { p.pcie_aggregate_Bps *= 2; }},
      {"nvlink", [](HardwareProfile& p) { p.gpu_gpu_Bps *= 2; }},
      {"network", [](HardwareProfile& p) { p.inter_node_Bps *= 2; }},
      {"dram", [](HardwareProfile& p) { p.cpu_memory_Bps *= 2; }},
      {"nvme", [](HardwareProfile& p) { p.nvme_read_Bps *= 2, p.nvme_write_Bps *= 2; }},
      {"cpu", [](HardwareProfile& p) { p.cpu_adam_params_per_s *= 2; }},
  };
  return d;
}

struct Config {
  std::string name;
  std::string model;  // catalogue name, or "" for the shape below
  int layers, hidden, heads;
  std::string placement;
  std::vector<std::string> place;
  double bsz;
  int mp, nodes;
};

void PrintTo(const Config& c, std::ostream* os) { *os << c.name; }

class DoublingAResource : public ::testing::TestWithParam<Config> {};

TEST_P(DoublingAResource, HelpsOnlyWhereTheReportSaysItIsBusy) {
  const Config& k = GetParam();
  const ModelSpec m = k.model.empty() ? *model_from_shape(k.layers, k.hidden, k.heads, 1024, 50257) : *load_model(k.model);
  const Placement pl = *load_placement(k.placement, k.place);
  TrainingConfig c;
  c.bsz = k.bsz;
  c.mp = k.mp;
  const HardwareProfile p = dgx2(k.nodes);
  const SimReport base = run(m, pl, c, p);
  int checked = 0;
  for (const auto& [resource, busy] : base.busy_fraction) {
    if (busy > 0.1 && busy < 0.9) continue;
    HardwareProfile q = p;
    doublers().at(resource)(q);
    const SimReport r = run(m, pl, c, q);
    const double change = r.iteration_s / base.iteration_s;
    std::cout << k.name << ": " << resource << " " << 100 * busy << " % busy, doubled: iteration x " << change << "\n";
    if (busy >= 0.9)
      EXPECT_LT(change, 0.99) << resource << " " << 100 * busy << " % busy: doubling it gave " << change;
    else
      EXPECT_NEAR(change, 1.0, 0.02) << resource << " " << 100 * busy << " % busy: doubling it gave " << change;
    ++checked;
  }
  EXPECT_GE(checked, 2);
}

INSTANTIATE_TEST_SUITE_P(
    Configurations, DoublingAResource,
    ::testing::Values(Config{"nvme_bound_1T", "table1-1T", 0, 0, 0, "zero_inf_nvme", {"act_ckpt=cpu"}, 2, 1, 1},
                      Config{"compute_bound_zero3", "", 8, 8192, 64, "zero3", {}, 16, 1, 1},
                      Config{"cpu_offload_two_nodes", "", 8, 8192, 64, "zero_inf_cpu", {}, 4, 1, 2},
                      Config{"nvswitch_bound_two_nodes", "", 4, 16384, 128, "zero3", {}, 0.125, 1, 2}),
    [](const ::testing::TestParamInfo<Config>& i) { return i.param.name; });

// LayerNorm reads and writes (B, T, C) in fp16 and does ~8 FLOPs per element: bound by HBM.
// A linear layer does 2 B T C C' FLOPs on B T (C + C') elements: bound by the peak.
TEST(Properties, MemoryBoundOperatorsTakeTheirBytesOverHbm) {
  const ModelSpec m = *model_from_shape(2, 4096, 32, 1024, 50257);
  const HardwareProfile p = dgx2();
  TrainingConfig c;
  c.bsz = 2;
  c.dp = 1;
  SimOptions o;
  o.trace = true;
  const SimReport r = run(m, *preset("data_parallel"), c, p, o);
  const double peak = p.peak_flops_per_s(m.hidden), tc = 2.0 * 1024 * 4096;
  std::map<std::string, double> took;
  for (const TraceEvent& e : r.trace)
    if (!took.count(e.name)) took[e.name] = e.end_s - e.start_s;
  EXPECT_NEAR(took.at("compute block0.ln1"), 2 * 2 * tc / p.gpu_memory_Bps, 1e-9);        // read + write
  EXPECT_NEAR(took.at("compute block0.residual1"), 3 * 2 * tc / p.gpu_memory_Bps, 1e-9);  // two inputs
  EXPECT_NEAR(took.at("compute block0.fc1"), 2 * tc * 4 * 4096 / peak, 1e-9);
}

// gpu.kernels (memwall calibrate) replaces the roofline for the kinds it names: a step takes its
// operator-graph FLOPs or activation bytes (at the schedule's bytes per element) at that rate;
// the kinds it does not name keep the roofline.
TEST(Properties, MeasuredKernelRatesCostTheirKinds) {
  const ModelSpec m = *model_from_shape(2, 1024, 16, 512, 50257);
  HardwareProfile p = dgx2();
  p.kernels = {{"gelu", 0, 40e9}, {"attention_scores", 5e12, 0}};
  TrainingConfig c;
  c.bsz = 2;
  c.dp = 1;
  SimOptions o;
  o.trace = true;
  MemorySizes fp32_acts;
  fp32_acts.act_bytes = 4;  // an executor's: the graph's fp16 bytes count double
  o.sizes = fp32_acts;
  const SimReport r = run(m, *preset("data_parallel"), c, p, o);
  const double peak = p.peak_flops_per_s(m.hidden), tc = 2.0 * 512 * 1024, t = 2.0 * 512;
  std::map<std::string, double> took;
  for (const TraceEvent& e : r.trace)
    if (!took.count(e.name)) took[e.name] = e.end_s - e.start_s;
  // GeLU: reads and writes (B, T, 4C), fp32
  EXPECT_NEAR(took.at("compute block0.gelu"), 2 * 4 * tc * 4 / 40e9, 1e-12);
  // the scores: 2 B NH T T hs FLOPs (QK^T) at the measured rate, whatever their bytes
  EXPECT_NEAR(took.at("compute block0.attn_scores"), 2 * t * 512 * 1024 / 5e12, 1e-12);
  // LayerNorm keeps the roofline, over the executor's fp32 bytes
  EXPECT_NEAR(took.at("compute block0.ln1"), 2 * 4 * tc / p.gpu_memory_Bps, 1e-12);
  EXPECT_NEAR(took.at("compute block0.fc1"), 2 * tc * 4 * 1024 / peak, 1e-12);
}

// ZeRO-Offload's broadcast: each rank owns a contiguous range of units and alone reads them over
// its PCIe link; every other rank's broadcast of a unit starts only once the owner has fetched it.
TEST(Properties, BroadcastWaitsForTheOwnersFetch) {
  const ModelSpec m = *model_from_shape(4, 2048, 16, 512, 1024);
  Placement pl = *preset("zero_inf_cpu");
  pl.fetch = ParamFetch::broadcast;
  pl.name = "zero_inf_cpu+broadcast";
  TrainingConfig c;
  c.bsz = 2;
  c.dp = 4;
  c.seq = m.seq;
  SimOptions o;
  o.trace = true;
  const HardwareProfile p = dgx2();
  const SimReport r = run(m, pl, c, p, o);
  EXPECT_TRUE(r.full);
  EXPECT_EQ(r.ranks_simulated, 4);
  // the owner's fetch.cg and everyone's fetch.bcast of each unit, in order of occurrence
  std::map<std::string, std::vector<double>> fetched;  // unit -> owner's cg end times
  std::map<std::pair<int, std::string>, std::vector<double>> bcast;  // (rank, unit) -> bcast start times
  std::vector<Schedule> s;
  for (int rank = 0; rank < 4; ++rank) s.push_back(*build_schedule(m, pl, c, p, rank));
  for (const TraceEvent& e : r.trace) {
    const Step& st = s[size_t(e.rank)].steps[size_t(e.step)];
    if (st.kind != StepKind::fetch || st.phase == Phase::optimizer) continue;
    if (st.hop == Hop::cg) fetched[st.name].push_back(e.end_s);
    if (st.hop == Hop::bcast && st.collective.root != e.rank) bcast[{e.rank, st.name}].push_back(e.start_s);
  }
  int checked = 0;
  for (const auto& [key, starts] : bcast) {
    const std::vector<double>& owner = fetched.at(key.second);
    ASSERT_EQ(owner.size(), starts.size()) << key.second;
    for (size_t i = 0; i < starts.size(); ++i, ++checked) EXPECT_GE(starts[i], owner[i] - 1e-12) << key.second;
  }
  EXPECT_GT(checked, 20);
}

}  // namespace
}  // namespace memwall::sim
