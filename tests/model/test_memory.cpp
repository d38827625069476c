// The memory model (model/memory.hpp) against its references: the operator graph for the
// parameters a rank holds, and build_schedule's walked peaks (a full walk of every step's
// allocations and frees) for the peaks it predicts in closed form.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

#include "model/analysis.hpp"
#include "model/memory.hpp"
#include "model/model_spec.hpp"
#include "model/placement.hpp"
#include "model/operator_graph.hpp"
#include "model/schedule.hpp"

namespace memwall {
namespace {

double units_sum(const std::vector<ParamUnit>& units) {
  return std::accumulate(units.begin(), units.end(), 0.0, [](double a, const ParamUnit& u) { return a + u.elems; });
}

// The operator graph's parameters on one tensor slice (Megatron-LM's): LayerNorms whole, the
// row-parallel layers' (proj, fc2) biases whole (each slice's partial sums meet in the all-reduce,
// the bias is added once), every other parameter 1/mp; with `replicated` the embedding whole too.
double graph_elems(const ModelSpec& m, int mp, bool replicated = false) {
  const OperatorGraph g = build_gpt_graph(m, 1, m.seq);
  double n = 0;
  for (size_t v : g.order) {
    const Operator& op = g.op(v);
    const bool row = op.role == OpRole::proj || op.role == OpRole::fc2;
    if (op.kind == OpKind::layernorm || (replicated && op.role == OpRole::embed)) n += op.param_elems;
    else if (row) n += op.weight_elems / mp + (op.param_elems - op.weight_elems);
    else n += op.param_elems / mp;
  }
  return n;
}

TEST(MemoryModel, UnitsAreTheOperatorGraphsParameters) {
  for (const char* name : {"table4-1.4B", "table1-10B", "table8-h8K"}) {
    const ModelSpec m = *load_model(name);
    for (int mp : {1, 4})
      for (int t : {1, 4}) {
        TrainingConfig c;
        c.seq = m.seq;
        c.mp = mp;
        c.tiling_factor = t;
        const std::vector<ParamUnit> units = param_units(m, c);
        EXPECT_NEAR(units_sum(units), graph_elems(m, mp), 1e-9 * graph_elems(m, mp)) << name << " mp " << mp;
        TrainingConfig whole_embedding = c;
        whole_embedding.embedding_replicated = true;
        EXPECT_NEAR(units_sum(param_units(m, whole_embedding)), graph_elems(m, mp, true), 1e-9 * graph_elems(m, mp))
            << name << " mp " << mp << ", embedding replicated";
        // every unit names an operator of the graph (or one of its tiles)
        const OperatorGraph g = build_gpt_graph(m, 1, m.seq);
        for (const ParamUnit& u : {units.front(), units[1], units[units.size() / 2], units.back()}) {
          const std::string op = u.name.substr(0, u.name.find('['));
          EXPECT_TRUE(std::any_of(g.order.begin(), g.order.end(), [&](size_t v) { return g.op(v).name == op; }))
              << u.name;
        }
        // pipeline stages hold every block once, and the embedding twice (the last stage's copy)
        c.pp = 3;
        double stages = 0;
        for (int s = 0; s < 3; ++s) stages += units_sum(param_units(m, c, s));
        const double embed = (double(m.vocab) + double(m.seq)) * double(m.hidden) / mp;
        EXPECT_NEAR(stages, graph_elems(m, mp) + embed, 1e-9 * stages) << name;
      }
  }
}

// The closed form the memory model and the planner use (kept_state_elems) against the units it
// stands for (kept_param_elems over param_units): every stage, slicing, tiling, expert parallelism
// and fetch. (The planner named every unit of every candidate until stop 52: 80 % of its time.)
TEST(MemoryModel, KeptStateInClosedFormIsTheUnitsSum) {
  ModelSpec moe = *load_model("table1-10B");
  moe.moe = {8, 2, 4 * moe.hidden, 0};
  for (const ModelSpec& m : {*load_model("table1-10B"), *load_model("table8-h8K"), moe})
    for (const char* name : {"zero3", "zero_offload", "data_parallel"})
      for (ParamFetch fetch : {ParamFetch::allgather, ParamFetch::broadcast})
        for (int mp : {1, 2})
          for (int pp : {1, 3})
            for (int ep : {1, 4})
              for (int t : {1, 4}) {
                if ((ep > 1 && (m.moe.experts == 0 || fetch == ParamFetch::broadcast))) continue;
                Placement pl = *preset(name);
                pl.fetch = fetch;
                TrainingConfig c;
                c.seq = m.seq;
                c.mp = mp, c.pp = pp, c.ep = ep, c.dp = 8, c.tiling_factor = t;
                for (int stage = 0; stage < pp; ++stage)
                  for (int rank : {0, 5}) {
                    const std::vector<ParamUnit> units = param_units(m, c, stage);
                    for (const StatePlacement* sp : {&pl.param16, &pl.optim32}) {
                      const double want = kept_param_elems(units, pl, *sp, c.dp, rank, c.ep);
                      EXPECT_NEAR(kept_state_elems(m, c, stage, pl, *sp, rank), want, 1e-9 * want)
                          << m.layers << " layers, experts " << m.moe.experts << " " << name << " mp " << mp << " pp "
                          << pp << " ep " << ep << " tiling " << t << " stage " << stage << " rank " << rank;
                    }
                  }
              }
}

// What the walk found against what the model predicted, over a grid; the worst ratio is printed.
struct Agreement {
  double lo = 1, hi = 1;
  std::string worst;
  int cases = 0;
  void add(double predicted, double walked, const std::string& what) {
    const double r = walked > 0 ? predicted / walked : (predicted > 0 ? 1e9 : 1);
    if (std::fabs(r - 1) > std::max(std::fabs(lo - 1), std::fabs(hi - 1))) worst = what;
    lo = std::min(lo, r);
    hi = std::max(hi, r);
    ++cases;
  }
};

void expect_persistent_equal(const MemoryModel& mm, const Schedule& s, const std::string& what) {
  for (int t = 0; t < kTiers; ++t)
    for (int st = 0; st < 4; ++st)
      ASSERT_DOUBLE_EQ(mm.tiers[size_t(t)].persistent[size_t(st)], s.persistent_bytes[size_t(t)][size_t(st)]) << what;
}

// The grid: models x every preset x bsz, ci, tiling. GPU and CPU peaks within 3 % of the
// walk (they agree exactly today), persistent states and capacities equal, and the parts add up.
TEST(MemoryModel, PredictsTheWalkedPeaksOfEveryPreset) {
  const HardwareProfile p = *load_profile("dgx2");
  Agreement gpu, cpu;
  for (const char* name : {"table4-1.4B", "table1-10B", "table8-h8K", "table1-100B"}) {
    const ModelSpec m = *load_model(name);
    for (const std::string& pn : preset_names())
      for (double bsz : {1.0, 8.0})
        for (int ci : {1, 4})
          for (int t : {1, 8}) {
            const Placement pl = *preset(pn);
            TrainingConfig c;
            c.seq = m.seq;
            c.bsz = bsz;
            c.ci = ci;
            c.tiling_factor = t;
            if (pl.layer_major) c.micro_batches = 4;
            if (pn == "three_d") c.mp = 4;
            c = *fit_to_profile(c, p);
            const Schedule s = *build_schedule(m, pl, c, p);
            const MemoryModel mm = memory_model(m, pl, c, p);
            const std::string what = std::string(name) + " " + pn + " bsz " + std::to_string(int(bsz)) + " ci " +
                                     std::to_string(ci) + " tiling " + std::to_string(t);
            expect_persistent_equal(mm, s, what);
            for (int k = 0; k < kTiers; ++k) EXPECT_EQ(mm.tiers[size_t(k)].capacity_bytes, s.capacity_bytes[size_t(k)]);
            const TierMemory& g = mm.of(Tier::gpu);
            EXPECT_NEAR(g.peak_bytes, s.peak_bytes[int(Tier::gpu)], 0.03 * s.peak_bytes[int(Tier::gpu)]) << what;
            EXPECT_NEAR(mm.of(Tier::cpu).peak_bytes, s.peak_bytes[int(Tier::cpu)], 0.03 * s.peak_bytes[int(Tier::cpu)])
                << what;
            EXPECT_EQ(g.fits(), s.peak_bytes[int(Tier::gpu)] <= s.capacity_bytes[int(Tier::gpu)]) << what;
            for (const TierMemory& tm : mm.tiers) {
              double sum = 0;
              for (const MemoryPart& part : tm.parts) sum += part.bytes;
              EXPECT_NEAR(sum, tm.peak_bytes, 1e-9 * tm.peak_bytes) << what;
            }
            gpu.add(g.peak_bytes, s.peak_bytes[int(Tier::gpu)], what + " (" + g.moment + ")");
            cpu.add(mm.of(Tier::cpu).peak_bytes, s.peak_bytes[int(Tier::cpu)], what);
          }
  }
  std::printf("GPU peak predicted / walked over %d cases: %.6f .. %.6f (worst %s)\n", gpu.cases, gpu.lo, gpu.hi,
              gpu.worst.c_str());
  std::printf("CPU peak predicted / walked: %.6f .. %.6f (worst %s)\n", cpu.lo, cpu.hi, cpu.worst.c_str());
}

// Beyond the presets' defaults: pipeline stages and their ranks, gradient accumulation, the
// executor's sizes (a preallocated workspace, fp32 activations), every optimizer overlap, prefetch
// depths 0, 1 and 5, one and two nodes. The GPU within 3 %; the CPU within 3 % except with chunks
// of NVMe optimizer states updated during backward, where the model adds the largest staged
// parameter read to the chunk (which read is in flight when a chunk completes is not modelled):
// an upper bound there, within 15 % without stages. Under stages that largest read is the
// embedding's (a stage holds a third of the blocks, dp is smaller, and the tied copy is whole on
// its stage) while the reads in flight when a chunk completes are blocks' groups: the bound is up
// to 32 % above the walk there (executor sizes, stage 0 of 3), and only the bound is checked.
TEST(MemoryModel, PredictsStagesRanksSizesAndOverlaps) {
  const HardwareProfile one = *load_profile("dgx2");
  Agreement gpu, cpu;
  for (int nodes : {1, 2}) {
    const HardwareProfile p = *scale_to_nodes(one, nodes);
    const ModelSpec m = *load_model("table4-1.4B");
    for (const std::string& pn : preset_names())
      for (OptimizerOverlap ov : {OptimizerOverlap::none, OptimizerOverlap::backward, OptimizerOverlap::dpu})
        for (int depth : {0, 1, 5})
          for (int pp : {1, 3})
            for (bool executor : {false, true})
            for (int ckpt : {0, 1, 2}) {  // three_d also with checkpoints partitioned over mp, on GPU and CPU
              if (ckpt > 0 && pn != "three_d") continue;
              Placement pl = *preset(pn);
              if (ckpt > 0) pl.act_ckpt = {ckpt == 1 ? Tier::gpu : Tier::cpu, true};
              if (!check_optimizer_overlap(pl, ov, 0)) continue;
              if (pp > 1 && pl.layer_major) continue;
              TrainingConfig c;
              c.seq = m.seq;
              c.bsz = 2;
              c.ci = 2;
              c.tiling_factor = 2;
              c.prefetch_depth = depth;
              c.pp = pp;
              c.grad_accum = 3;
              c.optimizer_overlap = ov;
              if (pl.layer_major) c.micro_batches = 3;
              if (pn == "three_d") c.mp = 2;
              c = *fit_to_profile(c, p);
              MemorySizes z;
              if (executor) {  // fp32 master, momentum and variance, fp32 activations, one workspace
                z.optim_bytes = 12;
                z.optim_grad_bytes = 0;
                z.act_bytes = 4;
                z.workspace_bytes = 1e8;
              }
              for (int stage = 0; stage < pp; ++stage)
                for (int rank : {0, c.dp - 1}) {
                  const Schedule s = *build_schedule(m, pl, c, p, rank, z, stage);
                  const MemoryModel mm = memory_model(m, pl, c, p, rank, z, stage);
                  const std::string what = std::to_string(nodes) + " node(s) " + pn + " overlap " + to_string(ov) +
                                           " depth " + std::to_string(depth) + " stage " + std::to_string(stage) +
                                           "/" + std::to_string(pp) + " rank " + std::to_string(rank) +
                                           (executor ? " executor sizes" : "") +
                                           (ckpt > 0 ? std::string(" act_ckpt ") + to_string(pl.act_ckpt.tier) + "/p" : "");
                  expect_persistent_equal(mm, s, what);
                  const double wg = s.peak_bytes[int(Tier::gpu)], wc = s.peak_bytes[int(Tier::cpu)];
                  EXPECT_NEAR(mm.of(Tier::gpu).peak_bytes, wg, 0.03 * wg) << what;
                  gpu.add(mm.of(Tier::gpu).peak_bytes, wg, what);
                  const bool nvme_overlap = ov == OptimizerOverlap::backward && pl.optim32.tier == Tier::nvme;
                  if (nvme_overlap) {
                    EXPECT_GE(mm.of(Tier::cpu).peak_bytes, wc * (1 - 1e-12)) << what;  // equal but for rounding, or above
                    if (pp == 1) {
                      EXPECT_LE(mm.of(Tier::cpu).peak_bytes, 1.15 * wc) << what;
                    }
                  } else {
                    EXPECT_NEAR(mm.of(Tier::cpu).peak_bytes, wc, 0.03 * wc) << what;
                    cpu.add(mm.of(Tier::cpu).peak_bytes, wc, what);
                  }
                }
            }
  }
  std::printf("GPU peak predicted / walked over %d cases: %.6f .. %.6f\n", gpu.cases, gpu.lo, gpu.hi);
  std::printf("CPU peak predicted / walked over %d cases: %.6f .. %.6f\n", cpu.cases, cpu.lo, cpu.hi);
}

// By hand, on a 2-layer model (hidden 1024, vocab 1000, seq 1024) under ZeRO-Infinity with
// everything on NVMe over 4 ranks, bsz 2, ci 1, prefetch depth 3: the GPU peaks in the backward
// of block 1's fc2, holding fc2, fc1 and ln2 (the group and the two fetched ahead), fc2's
// gradient, the tied embedding's gradient collected since the LM head, both checkpoints and
// block 1's activation working memory (Eq. 5).
TEST(MemoryModel, ZeroInfinityNvmeByHand) {
  const ModelSpec m = *model_from_shape(2, 1024, 16, 1024, 1000);
  HardwareProfile p = *load_profile("dgx2");
  TrainingConfig c;
  c.bsz = 2;
  c.dp = 4;
  const MemoryModel mm = memory_model(m, *preset("zero_inf_nvme"), c, p);
  const double C = 1024;
  const double fc1 = 2 * (4 * C * C + 4 * C), fc2 = 2 * (4 * C * C + C), ln = 2 * 2 * C;
  const double embed = 2 * (1000 + 1024) * C;
  const double ckpt = 2 * 2 * 1024 * C;                       // Eq. 3 per checkpoint
  const double awm = awm_bytes_eq5(2, 1024, 1, 1024, 16);     // Eq. 5, one block
  EXPECT_DOUBLE_EQ(mm.of(Tier::gpu).peak_bytes, (fc2 + fc1 + ln) + fc2 + embed + 2 * ckpt + awm);
  EXPECT_EQ(mm.of(Tier::gpu).moment, "backward of block1.fc2");
  // NVMe: this rank's quarter of 20 bytes per parameter
  const double n = (1000 + 1024) * C + 2 * (4 * C + 12 * C * C + 9 * C) + 2 * C;
  EXPECT_DOUBLE_EQ(mm.of(Tier::nvme).peak_bytes, 20 * n / 4);
  // CPU: three optimizer chunk buffers of the largest chunk, 20 bytes per parameter (states,
  // gradient, parameter); chunks of 1/16 of the partition, cut at 4096-parameter granules
  const Schedule s = *build_schedule(m, *preset("zero_inf_nvme"), c, p);
  const double target = std::ceil(n / 4 / 16);
  EXPECT_LE(s.optimizer_chunk_params, target);
  EXPECT_GT(s.optimizer_chunk_params, target - kChunkGranule);
  EXPECT_DOUBLE_EQ(mm.of(Tier::cpu).peak_bytes, 3 * 20 * s.optimizer_chunk_params);
  EXPECT_DOUBLE_EQ(mm.cpu_buffer_bytes, mm.of(Tier::cpu).peak_bytes);
  EXPECT_DOUBLE_EQ(s.peak_bytes[int(Tier::gpu)], mm.of(Tier::gpu).peak_bytes);
}

// gpu.reserve (issue 28 item 4): a GPU's capacity is its memory less the context, the workspace and
// a communicator's buffers per group of more than one rank; the schedule's capacity and its
// overflow use exactly that, so a schedule that fits the bare GPU to the byte overflows with it.
TEST(MemoryModel, FrameworkReserveLeavesTheGpuLessToTrainIn) {
  HardwareProfile p = *load_profile("dgx2");
  const GpuReserve r = p.gpu_reserve;
  ASSERT_TRUE(r.given);
  TrainingConfig c;
  c.dp = 1;
  EXPECT_EQ(communicators_per_rank(c), 0);
  EXPECT_DOUBLE_EQ(capacity_per_rank(c, p)[size_t(Tier::gpu)], p.gpu_memory_bytes - r.context_bytes - r.workspace_bytes);
  c.dp = 4;
  c.mp = 2;
  EXPECT_EQ(communicators_per_rank(c), 2);
  c.pp = 2;
  EXPECT_EQ(communicators_per_rank(c), 3);
  EXPECT_DOUBLE_EQ(gpu_reserve_bytes(c, p), r.context_bytes + r.workspace_bytes + 3 * r.communicator_bytes);
  EXPECT_NE(describe_gpu_reserve(c, p).find("3 communicators x 128 MiB"), std::string::npos) << describe_gpu_reserve(c, p);

  // a model whose schedule fills a GPU: fits the bare GPU, overflows once the reserve is counted
  const ModelSpec m = *model_from_shape(4, 1024, 16, 1024, 1000);
  TrainingConfig k;
  k.bsz = 4;
  k.dp = 2;
  HardwareProfile bare = p;
  bare.gpu_reserve = GpuReserve{};
  const Schedule probe = *build_schedule(m, *preset("zero3"), k, bare);
  const double need = probe.peak_bytes[size_t(Tier::gpu)];
  bare.gpu_memory_bytes = need + 1;  // to the byte, and one more
  p.gpu_memory_bytes = need + 1;
  const Schedule fits = *build_schedule(m, *preset("zero3"), k, bare);
  EXPECT_FALSE(fits.overflow.has_value()) << fits.overflow->message;
  const Schedule over = *build_schedule(m, *preset("zero3"), k, p);
  ASSERT_TRUE(over.overflow.has_value());
  EXPECT_EQ(over.overflow->tier, Tier::gpu);
  EXPECT_DOUBLE_EQ(over.capacity_bytes[size_t(Tier::gpu)], need + 1 - r.context_bytes - r.workspace_bytes - r.communicator_bytes);
  EXPECT_DOUBLE_EQ(memory_model(m, *preset("zero3"), k, p).of(Tier::gpu).capacity_bytes,
                   over.capacity_bytes[size_t(Tier::gpu)]);
}

}  // namespace
}  // namespace memwall
