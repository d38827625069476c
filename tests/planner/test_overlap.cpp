// The optimizer overlap as a planner dimension (issue 18): which placements allow it, its closed
// form in the time estimate, the search's default (exact overlaps only; dpu when allowed), --fix,
// and plan files that carry it to `memwall run --plan`.
#include <gtest/gtest.h>

#include "model/schedule.hpp"
#include "planner/plan_file.hpp"
#include "planner/search.hpp"
#include "cli/fix_flags.hpp"
#include "planner_test_util.hpp"

namespace memwall::planner {
namespace {

using cli::parse_fixes;  // --fix words, parsed in cli/

using testing::make_candidate;
using testing::make_model;
using testing::make_profile;
using testing::ProfileSpec;

TEST(Overlap, AllowedOnlyWhereTheCpuUpdatesWhileTheGpuComputes) {
  const Placement cpu = *preset("zero_inf_cpu"), nvme = *preset("zero_inf_nvme"), gpu = *preset("zero3");
  EXPECT_TRUE(check_optimizer_overlap(gpu, OptimizerOverlap::none, 0).ok());
  Result<bool> r = check_optimizer_overlap(gpu, OptimizerOverlap::backward, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("optimizer states off the GPU"), std::string::npos) << r.error();
  EXPECT_TRUE(check_optimizer_overlap(cpu, OptimizerOverlap::backward, 0).ok());
  EXPECT_TRUE(check_optimizer_overlap(nvme, OptimizerOverlap::backward, 0).ok());
  // dpu keeps the parameters on the GPU (ZeRO-Offload); zero_inf_* moves them off
  r = check_optimizer_overlap(cpu, OptimizerOverlap::dpu, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("param16 on gpu"), std::string::npos) << r.error();
  Placement offload = cpu;
  offload.param16.tier = Tier::gpu;
  EXPECT_TRUE(check_optimizer_overlap(offload, OptimizerOverlap::dpu, 0).ok());
  // gradients kept on the GPU until backward ends leave nothing to overlap
  Placement grads_on_gpu = cpu;
  grads_on_gpu.grad16.tier = Tier::gpu;
  r = check_optimizer_overlap(grads_on_gpu, OptimizerOverlap::backward, 0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("grad16 on cpu or nvme"), std::string::npos) << r.error();
}

// The closed form of fit.hpp: backward hides the optimizer behind 3/4 of the computation, dpu
// behind all of it, with the refresh exposed after it.
TEST(Overlap, TimeEstimateFollowsTheClosedForm) {
  HardwareProfile p = make_profile({});
  ModelSpec m = make_model(8, 4096, 32);
  Candidate c = make_candidate("zero_inf_cpu", 8, 1, 1, 1);
  c.placement.param16.tier = Tier::gpu;  // ZeRO-Offload: the only placement all three allow
  const TimeBreakdown none = estimate_time(m, c, p);
  ASSERT_GT(none.optimizer_s, 0);
  c.config.optimizer_overlap = OptimizerOverlap::backward;
  const TimeBreakdown bwd = estimate_time(m, c, p);
  c.config.optimizer_overlap = OptimizerOverlap::dpu;
  const TimeBreakdown dpu = estimate_time(m, c, p);
  const double opt = std::max(none.optimizer_s, none.refresh_s);
  EXPECT_NEAR(none.exposed_s - bwd.exposed_s, opt - std::max(0.0, opt - 0.75 * none.compute_s), 1e-12);
  EXPECT_NEAR(none.exposed_s - dpu.exposed_s,
              opt - (std::max(0.0, none.optimizer_s - none.compute_s) + none.refresh_s), 1e-12);
  EXPECT_LT(bwd.iteration_s, none.iteration_s);
  EXPECT_EQ(bwd.compute_s, none.compute_s);
}

// 8 layers, hidden 4096 on a 16 GB GPU: the optimizer states must leave the GPU, and CPU Adam at
// 1.5 G params/s (~1.1 s per step) is as long as the computation at bsz 8: the overlap is worth
// choosing. PCIe at 48 GB/s makes dpu's exposed refresh (0.07 s) smaller than what backward leaves
// exposed (the optimizer minus 3/4 of the computation, ~0.3 s): dpu wins when allowed.
TEST(Overlap, SearchTakesTheExactOverlapAndDpuOnlyWhenAllowed) {
  ProfileSpec s;
  s.gpu_memory = "16 GB";
  HardwareProfile p = make_profile(s);
  p.pcie_single_gpu_Bps = p.pcie_aggregate_Bps = 48e9;
  ModelSpec m = make_model(8, 4096, 32);
  SearchSpace space = *make_space(m, p, *parse_fixes({"bsz=8", "ci=1", "tiling=1"}));
  ASSERT_EQ(space.overlaps, (std::vector<OptimizerOverlap>{OptimizerOverlap::none, OptimizerOverlap::backward}));
  SearchResult r = search(m, p, space);
  ASSERT_TRUE(r.fits());
  const Evaluated& best = r.ranked.front();
  EXPECT_EQ(best.candidate.config.optimizer_overlap, OptimizerOverlap::backward);
  for (const Evaluated& e : r.ranked) EXPECT_NE(e.candidate.config.optimizer_overlap, OptimizerOverlap::dpu);
  // the same candidate without the overlap is slower by what the overlap hides
  Candidate plain = best.candidate;
  plain.config.optimizer_overlap = OptimizerOverlap::none;
  EXPECT_GT(evaluate(m, plain, p).time.iteration_s, best.time.iteration_s);
  // the space counts only the overlaps each placement allows: zero3 keeps its states on the GPU
  const std::vector<std::string> zero3 = {"strategy=zero3", "bsz=8", "ci=1", "tiling=1"};
  std::vector<std::string> zero3_none = zero3;
  zero3_none.push_back("optimizer_overlap=none");
  EXPECT_EQ(make_space(m, p, *parse_fixes(zero3))->size(), make_space(m, p, *parse_fixes(zero3_none))->size());
  EXPECT_LT(make_space(m, p, *parse_fixes({"strategy=zero_inf_cpu", "bsz=8", "ci=1", "tiling=1",
                                           "optimizer_overlap=none"}))->size(),
            make_space(m, p, *parse_fixes({"strategy=zero_inf_cpu", "bsz=8", "ci=1", "tiling=1"}))->size());

  space.overlaps.push_back(OptimizerOverlap::dpu);
  SearchResult with_dpu = search(m, p, space);
  ASSERT_TRUE(with_dpu.fits());
  const Evaluated& fastest = with_dpu.ranked.front();
  EXPECT_EQ(fastest.candidate.config.optimizer_overlap, OptimizerOverlap::dpu);
  EXPECT_EQ(fastest.candidate.placement.param16.tier, Tier::gpu);
  EXPECT_LT(fastest.time.iteration_s, best.time.iteration_s);
}

TEST(Overlap, FixPinsItAndRejectsUnknownValues) {
  Result<Fixes> f = parse_fixes({"optimizer_overlap=dpu"});
  ASSERT_TRUE(f.ok()) << f.error();
  EXPECT_EQ(f->overlap, OptimizerOverlap::dpu);
  Result<Fixes> bad = parse_fixes({"optimizer_overlap=sideways"});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error(), "--fix optimizer_overlap: expected none, backward or dpu, got \"sideways\"");
  HardwareProfile p = make_profile({});
  ModelSpec m = make_model(8, 4096, 32);
  EXPECT_EQ(make_space(m, p, *f)->overlaps, std::vector<OptimizerOverlap>{OptimizerOverlap::dpu});
}

Plan small_plan(OptimizerOverlap ov) {
  Plan plan;
  plan.profile = "test";
  plan.nodes = 1;
  plan.gpus = 1;
  plan.model = make_model(8, 4096, 32);
  plan.candidate = make_candidate("zero_inf_cpu", 8, 1, 1, 1);
  plan.candidate.placement.param16.tier = Tier::gpu;
  plan.candidate.placement.name = placement_label(plan.candidate.placement);
  plan.candidate.config.optimizer_overlap = ov;
  plan.candidate.config.dpu_warmup = 7;
  plan.candidate.config.optimizer_chunks = 24;
  return plan;
}

TEST(Overlap, PlanFilesCarryIt) {
  HardwareProfile p = make_profile({});
  for (OptimizerOverlap ov : {OptimizerOverlap::none, OptimizerOverlap::backward, OptimizerOverlap::dpu}) {
    const std::string y = plan_yaml(small_plan(ov));
    Result<Plan> b = parse_plan(y, "plan.yaml", &p);
    ASSERT_TRUE(b.ok()) << b.error() << "\n" << y;
    EXPECT_EQ(b->candidate.config.optimizer_overlap, ov);
    EXPECT_EQ(b->candidate.config.optimizer_chunks, 24);
    EXPECT_EQ(b->candidate.config.dpu_warmup, ov == OptimizerOverlap::dpu ? 7 : 40);  // written only for dpu
    EXPECT_EQ(y.find("changes the training dynamics") != std::string::npos, ov == OptimizerOverlap::dpu);
  }
  std::string y = plan_yaml(small_plan(OptimizerOverlap::backward));
  y.replace(y.find("optimizer_overlap: backward"), 27, "optimizer_overlap: sideways");
  Result<Plan> bad = parse_plan(y, "plan.yaml", &p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("training.optimizer_overlap: expected none, backward or dpu, got \"sideways\""),
            std::string::npos)
      << bad.error();
}


// Gradient clipping (TrainingConfig::grad_clip): the backward overlap is refused (it updates before
// the global norm exists), the search keeps it out, and the estimate adds one pass over each rank's
// gradient partition: HBM for gradients on the GPU, CPU memory shared by the node's ranks, nothing
// for NVMe (summed as each final gradient is written).
TEST(GradClip, RulesOutTheBackwardOverlapAndCostsOnePassOverTheGradients) {
  const Placement cpu = *preset("zero_inf_cpu");
  Result<bool> r = check_optimizer_overlap(cpu, OptimizerOverlap::backward, 1.0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("not with --grad-clip"), std::string::npos) << r.error();
  EXPECT_TRUE(check_optimizer_overlap(cpu, OptimizerOverlap::none, 1.0).ok());
  Placement offload = cpu;
  offload.param16.tier = Tier::gpu;
  EXPECT_TRUE(check_optimizer_overlap(offload, OptimizerOverlap::dpu, 1.0).ok());

  ProfileSpec s;
  s.gpu_memory = "16 GB";
  HardwareProfile p = make_profile(s);
  ModelSpec m = make_model(8, 4096, 32);
  SearchSpace space = *make_space(m, p, *parse_fixes({"bsz=8", "ci=1", "tiling=1"}));
  space.grad_clip = 1.0;
  SearchResult sr = search(m, p, space);
  ASSERT_TRUE(sr.fits());
  for (const Evaluated& e : sr.ranked) {
    EXPECT_NE(e.candidate.config.optimizer_overlap, OptimizerOverlap::backward);
    EXPECT_EQ(e.candidate.config.grad_clip, 1.0);
  }
  for (const char* name : {"zero3", "zero_inf_cpu", "zero_inf_nvme"}) {
    SCOPED_TRACE(name);
    Candidate c = make_candidate(name, 8, 1, 1, 1);
    const TimeBreakdown plain = estimate_time(m, c, p);
    c.config.grad_clip = 1.0;
    const TimeBreakdown clipped = estimate_time(m, c, p);
    const double dp = c.config.dp, ranks = p.ranks_per_node(long(dp));
    // fp16 gradients of this rank's optimizer partition, within the few per cent that Eq. 9's
    // parameter count differs from the operator graph's
    const double bytes = 2.0 * double(model_param_count(m)) / (c.placement.optim32.partitioned ? dp : 1);
    const Tier t = c.placement.grad16.tier;
    const double expect = t == Tier::nvme ? 0 : t == Tier::gpu ? bytes / p.gpu_memory_Bps : bytes / (p.cpu_memory_Bps / ranks);
    EXPECT_NEAR(clipped.grad_norm_s, expect, 0.05 * expect + 1e-12);
    EXPECT_NEAR(clipped.iteration_s - plain.iteration_s, clipped.grad_norm_s, 1e-12);
    EXPECT_EQ(plain.grad_norm_s, 0);
  }
}

TEST(GradClip, PlanFilesCarryItAndRefuseItBesideTheBackwardOverlap) {
  HardwareProfile p = make_profile({});
  Plan plan = small_plan(OptimizerOverlap::none);
  plan.candidate.config.grad_clip = 0.5;
  const std::string y = plan_yaml(plan);
  Result<Plan> b = parse_plan(y, "plan.yaml", &p);
  ASSERT_TRUE(b.ok()) << b.error() << "\n" << y;
  EXPECT_EQ(b->candidate.config.grad_clip, 0.5);
  EXPECT_EQ(parse_plan(plan_yaml(small_plan(OptimizerOverlap::none)), "plan.yaml", &p)->candidate.config.grad_clip, 0);
  plan.candidate.config.optimizer_overlap = OptimizerOverlap::backward;
  Result<Plan> bad = parse_plan(plan_yaml(plan), "plan.yaml", &p);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("training.optimizer_overlap: --optimizer-overlap backward: not with --grad-clip"),
            std::string::npos)
      << bad.error();
}

}  // namespace
}  // namespace memwall::planner
