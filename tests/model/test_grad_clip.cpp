// Gradient clipping in the schedule (TrainingConfig::grad_clip): one grad_norm step once every
// gradient is final, reading this rank's optimizer partition of the gradients where they live
// (nothing on NVMe: those were summed as they were written), the exchange of the sums over dp where
// the partition is spread, and every update after it. Refused with the backward overlap, which
// updates before the last gradient exists.
#include <gtest/gtest.h>

#include <functional>
#include <set>

#include "model/schedule.hpp"

namespace memwall {
namespace {

const char* const kClipPresets[] = {"data_parallel", "zero2",         "zero_offload", "zero3",
                                "zero_inf_cpu",  "zero_inf_nvme", "three_d",      "l2l"};

Result<Schedule> make_clipped(const std::string& strategy, int dp, double clip, int grad_accum = 1,
                      OptimizerOverlap ov = OptimizerOverlap::none) {
  const ModelSpec m = *model_from_shape(3, 256, 4, 64, 512);
  TrainingConfig c;
  c.seq = m.seq;
  c.bsz = 2;
  c.dp = dp;
  c.grad_clip = clip;
  c.grad_accum = grad_accum;
  c.optimizer_overlap = ov;
  if (strategy == "three_d") c.mp = 2;
  if (strategy == "l2l") c.micro_batches = 2;
  return build_schedule(m, *preset(strategy), c, *load_profile("dgx2"), dp - 1);
}

// The steps `to` depends on, directly or not.
std::set<int> clip_ancestors(const Schedule& s, int to) {
  std::set<int> seen;
  std::function<void(int)> walk = [&](int id) {
    for (int d : s.steps[size_t(id)].deps)
      if (seen.insert(d).second) walk(d);
  };
  walk(to);
  return seen;
}

TEST(GradClip, EveryUpdateWaitsForTheNormOfEveryFinalGradient) {
  for (const char* name : kClipPresets)
    for (int dp : {1, 2})
      for (int ga : {1, 2}) {
        SCOPED_TRACE(std::string(name) + " dp " + std::to_string(dp) + " grad_accum " + std::to_string(ga));
        Result<Schedule> plain = make_clipped(name, dp, 0, ga), clipped = make_clipped(name, dp, 1.0, ga);
        ASSERT_TRUE(plain.ok()) << plain.error();
        ASSERT_TRUE(clipped.ok()) << clipped.error();
        const Schedule& s = *clipped;
        EXPECT_TRUE(check_invariants(s).empty()) << check_invariants(s).front();
        std::vector<int> local, exchange;
        for (const Step& st : s.steps)
          if (st.kind == StepKind::grad_norm) (is_collective(st) ? exchange : local).push_back(st.id);
        for (const Step& st : plain->steps) EXPECT_NE(st.kind, StepKind::grad_norm);
        ASSERT_EQ(local.size(), 1u);
        const Placement pl = *preset(name);
        const bool spread = dp > 1 && pl.optim32.partitioned;
        const bool sliced = s.config.mp > 1;  // then the slices' sums too, over mp
        ASSERT_EQ(exchange.size(), std::size_t(spread) + std::size_t(sliced));
        EXPECT_EQ(s.steps.size(), plain->steps.size() + 1 + exchange.size());
        // the pass reads this rank's optimizer partition of the gradients: what the updates update
        double updated = 0;
        for (const Step& st : s.steps)
          if (st.kind == StepKind::optimizer) updated += st.params;
        const Step& pass = s.steps[size_t(local[0])];
        EXPECT_EQ(pass.src, pl.grad16.tier == Tier::gpu ? Tier::gpu : Tier::cpu);
        EXPECT_DOUBLE_EQ(pass.bytes, pl.grad16.tier == Tier::nvme ? 0 : s.sizes.param_bytes * updated);
        EXPECT_STREQ(step_resource(pass), pl.grad16.tier == Tier::nvme ? "" : pl.grad16.tier == Tier::gpu ? "gpu_compute" : "cpu");
        if (spread) {
          const Step& x = s.steps[size_t(exchange[0])];
          EXPECT_EQ(x.collective.kind, CollectiveKind::all_gather);
          EXPECT_EQ(x.collective.group, CommGroup::dp);
          EXPECT_EQ(x.collective.members, dp);
          EXPECT_DOUBLE_EQ(x.collective.bytes_per_rank, 8);
          EXPECT_DOUBLE_EQ(x.bytes, 8.0 * (dp - 1));
          EXPECT_EQ(x.deps, std::vector<int>{local[0]});
        }
        if (sliced) {
          const Step& x = s.steps[size_t(exchange.back())];
          EXPECT_EQ(x.collective.group, CommGroup::mp);
          EXPECT_EQ(x.collective.members, s.config.mp);
          EXPECT_DOUBLE_EQ(x.collective.bytes_per_rank, 8);
          EXPECT_EQ(x.deps, std::vector<int>{spread ? exchange[0] : local[0]});
        }
        const int norm = exchange.empty() ? local[0] : exchange.back();
        // every gradient, as the last micro-step leaves it, before the pass
        const std::set<int> before = clip_ancestors(s, local[0]);
        for (const Step& st : s.steps) {
          const bool makes_gradient = (st.kind == StepKind::compute && st.phase == Phase::backward) ||
                                      (st.phase == Phase::backward && st.state == State::grad16);
          if (makes_gradient) {
            EXPECT_TRUE(before.count(st.id)) << step_label(st) << " after the norm";
          }
          if (st.kind == StepKind::optimizer) {
            EXPECT_TRUE(clip_ancestors(s, st.id).count(norm)) << step_label(st);
          }
        }
      }
}

// Pipeline stages: each stage sums its own blocks' gradients; after dp and mp, the sums are
// exchanged over the stages (the pp group: this rank's dp rank and slice in every stage), across
// the network where the stages span nodes, and every update of every stage waits for it.
TEST(GradClip, StagesExchangeTheirSumsLast) {
  const ModelSpec m = *model_from_shape(4, 256, 4, 64, 512);
  for (int nodes : {1, 2})
    for (int stage : {0, 1}) {
      SCOPED_TRACE("nodes " + std::to_string(nodes) + " stage " + std::to_string(stage));
      TrainingConfig c;
      c.seq = m.seq;
      c.bsz = 2;
      c.mp = 2;
      c.pp = 2;
      c.dp = 4 * nodes;  // 16 GPUs a stage on two nodes
      c.grad_accum = 2;
      c.grad_clip = 1;
      const HardwareProfile p = *scale_to_nodes(*load_profile("dgx2"), nodes);
      Result<Schedule> s = build_schedule(m, *preset("zero3"), c, p, 0, MemorySizes{}, stage);
      ASSERT_TRUE(s.ok()) << s.error();
      EXPECT_TRUE(check_invariants(*s).empty());
      std::vector<const Step*> exchange;
      for (const Step& st : s->steps)
        if (st.kind == StepKind::grad_norm && is_collective(st)) exchange.push_back(&st);
      ASSERT_EQ(exchange.size(), 3u);
      EXPECT_EQ(exchange[0]->collective.group, CommGroup::dp);
      EXPECT_EQ(exchange[1]->collective.group, CommGroup::mp);
      const Step& x = *exchange[2];
      EXPECT_EQ(x.collective.group, CommGroup::pp);
      EXPECT_EQ(x.collective.kind, CollectiveKind::all_gather);
      EXPECT_EQ(x.collective.members, 2);
      EXPECT_DOUBLE_EQ(x.collective.bytes_per_rank, 8);
      EXPECT_EQ(x.deps, std::vector<int>{exchange[1]->id});
      EXPECT_EQ(x.link, nodes == 1 ? LinkClass::gpu_gpu : LinkClass::network);
      for (const Step& st : s->steps) {
        if (st.kind == StepKind::optimizer) {
          EXPECT_TRUE(clip_ancestors(*s, st.id).count(x.id)) << step_label(st);
        }
      }
    }
}

TEST(GradClip, TheDelayedUpdateAppliesTheNormOfTheIterationBefore) {
  // dpu: the updates run first, on the last iteration's gradients (their norm was taken then); this
  // iteration's norm follows its last gradient and nothing waits for it
  Result<Schedule> s = make_clipped("zero_offload", 2, 1.0, 1, OptimizerOverlap::dpu);
  ASSERT_TRUE(s.ok()) << s.error();
  EXPECT_TRUE(check_invariants(*s).empty()) << check_invariants(*s).front();
  int first_norm = -1, last_update = -1;
  for (const Step& st : s->steps) {
    if (st.kind == StepKind::grad_norm && first_norm < 0) first_norm = st.id;
    if (st.kind == StepKind::optimizer) last_update = st.id;
  }
  ASSERT_GE(first_norm, 0);
  EXPECT_LT(last_update, first_norm);
}

TEST(GradClip, RefusedWithTheBackwardOverlapAndOutOfRange) {
  Result<Schedule> s = make_clipped("zero_inf_cpu", 1, 1.0, 1, OptimizerOverlap::backward);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().find("--optimizer-overlap backward: not with --grad-clip"), std::string::npos) << s.error();
  EXPECT_TRUE(make_clipped("zero_inf_cpu", 1, 0, 1, OptimizerOverlap::backward).ok());
  for (double bad : {-1.0, std::nan(""), 1e10}) {
    Result<Schedule> r = make_clipped("zero3", 1, bad);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().rfind("--grad-clip: expected the largest global gradient norm", 0), 0u) << r.error();
  }
}

}  // namespace
}  // namespace memwall
