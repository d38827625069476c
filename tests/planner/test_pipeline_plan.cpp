// Pipeline stages in the planner (issue 17, item 4): the 3D-parallel baseline searches pp, its time
// has 1F1B's bubble and the stage-to-stage traffic, its fit holds one stage's states and the
// checkpoints of its micro-batches in flight, the detailed schedule confirms it stage by stage,
// and plan files carry pp.
#include <gtest/gtest.h>

#include <string>

#include "model/units.hpp"
#include "planner/plan_file.hpp"
#include "planner/recommend.hpp"
#include "planner/search.hpp"
#include "planner_test_util.hpp"

namespace memwall::planner {
namespace {

Candidate three_d(const ModelSpec& m, int mp, int pp, int dp, int micro_batches) {
  Candidate c{*preset("three_d"), {}};
  c.config.seq = m.seq;
  c.config.mp = mp;
  c.config.pp = pp;
  c.config.dp = dp;
  c.config.grad_accum = micro_batches;
  return c;
}

// With everything on the GPU nothing but the bubble and Adam (on the GPU, once per step) separate an
// iteration from its passes: the idle share of the passes is (p-1)/(m+p-1), and the passes themselves take 1/pp of the unpipelined blocks (48
// blocks: 24 or 12 per stage) plus the final norm and LM head, which the last stage computes.
TEST(PipelinePlan, BubbleIsOneFOneBs) {
  const HardwareProfile p = *load_profile("dgx2");
  ModelSpec m = *load_model("table1-10B");
  m.layers = 48;
  for (int pp : {2, 4})
    for (int mb : {1, 4, 16}) {
      SCOPED_TRACE("pp " + std::to_string(pp) + " m " + std::to_string(mb));
      const TimeBreakdown t = estimate_time(m, three_d(m, 4, pp, 16 / (4 * pp), mb), p);
      EXPECT_GT(t.optimizer_s, 0);
      EXPECT_NEAR(t.bubble_s / (t.iteration_s - t.optimizer_s), pipeline_bubble(pp, mb), 1e-9);
      const Candidate one = three_d(m, 4, 1, 16 / 4, mb);
      const TimeBreakdown flat = estimate_time(m, one, p);
      const PassCompute pc = pass_compute(p, m, one.config, p.peak_flops_per_s(m.hidden));
      const double outer = pc.outer_s * mb, head = (pc.outer_s - pc.embed_s) * mb;
      EXPECT_GT(pc.embed_s, 0);
      EXPECT_GT(head, 0);
      EXPECT_NEAR((t.compute_s - head) * pp, flat.compute_s - outer, 1e-9 * flat.compute_s);
      EXPECT_GT(t.p2p_s, 0);
    }
}

// Stages hold whole blocks (stage_chunks): 50 blocks over 4 stages are 12, 13, 12, 13, and over 4
// stages of 2 chunks 6 + 6, 6 + 6, 6 + 6 and 7 + 7. The slowest stage sets every micro-step's pace,
// so 50 blocks cost what 52 (13 each) and 56 (7 per chunk) cost, not 12.5 blocks' worth.
TEST(PipelinePlan, TheSlowestStageSetsThePace) {
  const HardwareProfile p = *load_profile("dgx2");
  const ModelSpec m = *load_model("table1-10B");
  ASSERT_EQ(m.layers, 50);
  auto compute = [&](int layers, int v) {
    ModelSpec x = m;
    x.layers = layers;
    Candidate c = three_d(x, 4, 4, 1, 8);
    c.config.virtual_stages = v;
    return estimate_time(x, c, p).compute_s;
  };
  EXPECT_DOUBLE_EQ(compute(50, 1), compute(52, 1));
  EXPECT_GT(compute(50, 1), compute(48, 1));
  EXPECT_DOUBLE_EQ(compute(50, 2), compute(56, 2));
  EXPECT_GT(compute(50, 2), compute(50, 1));
}

// A stage holds its blocks' states, plus the embedding on the first and the last stage: the
// planner's state parts are 20 B per parameter of the stage's units (which the model tests hold
// against the operator graph), for the stage that binds. The first stage holds the checkpoints of
// min(pp, m) micro-batches in flight.
TEST(PipelinePlan, AStageHoldsItsShareOfTheStates) {
  const HardwareProfile p = *load_profile("dgx2");
  const ModelSpec m = *load_model("table1-10B");
  const Candidate c = three_d(m, 4, 4, 1, 16);
  const FitReport f = check_fit(m, c, p);
  double states = 0;
  for (const Part& part : f.checks.front().parts)
    for (const char* state : {"param16", "grad16", "optim32"})
      if (part.what.rfind(state, 0) == 0) states += part.bytes;
  const std::string& moment = f.checks.front().moment;
  const int stage = moment.find("(last pipeline stage)") != std::string::npos ? 3 : 0;
  ASSERT_TRUE(stage == 3 || moment.find("(first pipeline stage)") != std::string::npos) << moment;
  double elems = 0;
  for (const ParamUnit& u : param_units(m, c.config, stage)) elems += u.elems;
  EXPECT_NEAR(states, 20 * elems, 1e-9 * states);
  // the first stage: its 12 blocks' checkpoints (ci 1) for each of its min(4, 16) micro-batches
  const MemoryModel first = memory_model(m, c.placement, c.config, p);
  double ckpt = 0;
  for (const MemoryPart& part : first.of(Tier::gpu).parts)
    if (part.what.find("activation checkpoints") != std::string::npos) ckpt = part.bytes;
  const StageBlocks sb = stage_blocks(m.layers, 4, 0);
  EXPECT_DOUBLE_EQ(ckpt, act_ckpt_bytes_eq3(1, m.seq, m.hidden, sb.last - sb.first, 1) * 4);
}

TEST(PipelinePlan, ThreeDSearchesStagesAndTheScheduleConfirmsThem) {
  const HardwareProfile p = *load_profile("dgx2");
  const ModelSpec m = *load_model("table1-10B");
  Fixes fx;
  fx.strategy = "three_d";
  const SearchSpace space = *make_space(m, p, fx);
  EXPECT_GT(space.pp.size(), 1u);
  const Recommendation rec = recommend(m, p, space, fx, SearchOptions{});
  ASSERT_TRUE(rec.fits()) << rec.shortfall;
  const TrainingConfig& k = rec.chosen->candidate.config;
  EXPECT_EQ(long(k.dp) * k.mp * k.pp, p.total_gpus());
  EXPECT_GT(k.pp, 1);  // at 10B the pipeline beats tensor slicing alone
  if (k.pp > 1) {  // every stage of the chosen plan fits the detailed schedule
    EXPECT_NE(rec.schedule_check.find("stage"), std::string::npos) << rec.schedule_check;
    for (int s = 0; s < k.pp; ++s) {
      Result<Schedule> st = build_schedule(m, rec.chosen->candidate.placement, k, p, 0, MemorySizes{}, s);
      ASSERT_TRUE(st.ok()) << st.error();
      EXPECT_FALSE(st->overflow.has_value()) << "stage " << s << ": " << st->overflow->message;
    }
  }
  // the default search keeps ZeRO's partitioned placements unpipelined (DeepSpeed: pipelines with
  // ZeRO stage 0 or 1 only)
  const SearchResult r = search(m, p, *make_space(m, p, {}));
  for (const Evaluated& e : r.top)
    if (e.candidate.placement.param16.partitioned) {
      EXPECT_EQ(e.candidate.config.pp, 1);
    }
  fx.strategy = "zero3";
  fx.pp = 4;
  EXPECT_FALSE(make_space(m, p, fx).ok());
}

// 50B on 8 DGX-2 nodes, 3D: the search's choice interleaves 62 blocks over 8 x 4 chunks, where
// stages 1 and 2 hold more than the first and the last. The fit and the schedule check looked at
// those two only and chose bsz 27, which `memwall simulate --plan` refused: out of memory on
// stage 1. Every stage of the chosen plan, at its own gradient accumulation, fits its schedule.
TEST(PipelinePlan, EveryStageOfTheChosenPlanFits) {
  const HardwareProfile p = *scale_to_nodes(*load_profile("dgx2"), 8);
  const ModelSpec m = *load_model("table1-50B");
  Fixes fx;
  fx.strategy = "three_d";
  const Recommendation rec = recommend(m, p, *make_space(m, p, fx), fx, SearchOptions{});
  ASSERT_TRUE(rec.fits()) << rec.shortfall;
  const Candidate& c = rec.chosen->candidate;
  ASSERT_GT(c.config.pp, 2);
  for (int s = 0; s < c.config.pp; ++s) {
    Result<Schedule> st = build_schedule(m, c.placement, c.config, p, 0, MemorySizes{}, s);
    ASSERT_TRUE(st.ok()) << st.error();
    EXPECT_FALSE(st->overflow.has_value()) << "stage " << s << " of " << c.config.pp << ": " << st->overflow->message;
  }
}

// Interleaved 1F1B (issue 28, item 3): the bubble shrinks to (p-1)/(v m+p-1) of the iteration at v
// times the stage-to-stage traffic; the 3D search tries 1, 2 and 4 chunks (for memwall run too),
// checks every stage of the chosen one against its schedule, and plan files carry them.
TEST(PipelinePlan, InterleavedStagesDivideTheBubbleAtVTimesTheTraffic) {
  const HardwareProfile p = *load_profile("dgx2");
  const ModelSpec m = *load_model("table1-10B");
  ModelSpec even = m;
  even.layers = 40;  // 10 blocks per stage: 10, 5 or 2 per chunk, every stage alike
  for (int v : {1, 2, 5})
    for (int mb : {4, 16}) {
      SCOPED_TRACE("v " + std::to_string(v) + " m " + std::to_string(mb));
      Candidate c = three_d(even, 4, 4, 1, mb);
      c.config.virtual_stages = v;
      const TimeBreakdown t = estimate_time(even, c, p);
      EXPECT_NEAR(t.bubble_s / (t.iteration_s - t.optimizer_s), pipeline_bubble(4, mb, v), 1e-9);  // Adam once per step
      const TimeBreakdown plain = estimate_time(even, three_d(even, 4, 4, 1, mb), p);
      EXPECT_NEAR(t.p2p_s, v * plain.p2p_s, 1e-9 * t.p2p_s);
      EXPECT_DOUBLE_EQ(t.compute_s, plain.compute_s);
    }
  Fixes fx;
  fx.strategy = "three_d";
  const SearchSpace space = *make_space(m, p, fx);
  EXPECT_EQ(space.virtual_stages, (std::vector<int>{1, 2, 4}));
  const Recommendation rec = recommend(m, p, space, fx, SearchOptions{});
  ASSERT_TRUE(rec.fits()) << rec.shortfall;
  const TrainingConfig& k = rec.chosen->candidate.config;
  EXPECT_GT(k.virtual_stages, 1);  // a smaller bubble for a few more messages over NVSwitch
  EXPECT_EQ(k.grad_accum % k.pp, 0);
  for (int s = 0; s < k.pp; ++s) {
    Result<Schedule> st = build_schedule(m, rec.chosen->candidate.placement, k, p, 0, MemorySizes{}, s);
    ASSERT_TRUE(st.ok()) << st.error();
    EXPECT_FALSE(st->overflow.has_value()) << "stage " << s << ": " << st->overflow->message;
  }
  // a plan for memwall run searches them too (the executor runs interleaved stages)
  SearchSpace run_space = space;
  EXPECT_EQ(narrow_to_executor(run_space, fx), "");
  EXPECT_EQ(run_space.virtual_stages, (std::vector<int>{1, 2, 4}));
  fx.strategy = "zero3";
  fx.virtual_stages = 2;
  Result<SearchSpace> bad = make_space(m, p, fx);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("--fix virtual_stages=2: interleaving needs pipeline stages"), std::string::npos)
      << bad.error();
}

// The analytic fit counts the live bytes; the schedule's memory plan places its buffers so that none
// moves, which can take more (table1-10B on 8 DGX-2 nodes, pp 2 x 2 chunks: bsz 27 fits in the
// memory model, its arena needs 31.1 of 31.0 GiB, checkpoints kept on the GPU). recommend sets it aside; the explanation then
// said "bsz 27 fits and gives the same 44.0 TFLOPS per GPU" two lines below "analytic choice
// rejected: ... bsz 27 ... overflows". An alternative the detailed check refused is said not to fit.
TEST(PipelinePlan, AnAlternativeTheScheduleRefusedIsNotSaidToFit) {
  const testing::RefusedCase rc = testing::recommend_with_a_refusal();
  const Recommendation& rec = rc.rec;
  ASSERT_TRUE(rec.fits()) << rec.shortfall;
  ASSERT_FALSE(rec.checked.rejected_keys.empty()) << "the case needs an analytic choice the schedule refuses";
  int said = 0;
  for (const std::string& key : rec.checked.rejected_keys) {
    // the refused candidate differs from the chosen one in its micro-batch: explain's "bsz" line
    Candidate refused = rec.chosen->candidate;
    const std::string bsz_line = "bsz " + format_g(refused.config.bsz) + ": bsz ";
    for (const std::string& line : rec.explanation)
      if (line.starts_with(bsz_line)) {
        const double next = std::stod(line.substr(bsz_line.size()));
        refused.config.bsz = next;
        if (candidate_key(refused) != key) continue;
        ++said;
        EXPECT_EQ(line.find(" fits and gives"), std::string::npos) << line;
        EXPECT_NE(line.find("fits the analytic model but overflows in the detailed schedule: out of memory on gpu"),
                  std::string::npos)
            << line;
      }
  }
  EXPECT_EQ(said, 1) << "the explanation's bsz line names the refused micro-batch";
}

TEST(PipelinePlan, PlanFilesCarryTheStages) {
  Plan a;
  a.profile = "dgx2";
  a.model = *load_model("table1-10B");
  a.candidate = three_d(a.model, 4, 4, 1, 16);
  a.candidate.placement.name = "three_d";
  a.candidate.config.ci = 2;
  a.gpus = 16;
  const HardwareProfile p = *load_profile("dgx2");
  Result<Plan> b = parse_plan(plan_yaml(a), "plan.yaml", &p);
  ASSERT_TRUE(b.ok()) << b.error();
  EXPECT_EQ(b->candidate.config.pp, 4);
  EXPECT_EQ(b->candidate.config.virtual_stages, 1);
  a.candidate.config.virtual_stages = 2;
  Result<Plan> v = parse_plan(plan_yaml(a), "plan.yaml", &p);
  ASSERT_TRUE(v.ok()) << v.error();
  EXPECT_EQ(v->candidate.config.virtual_stages, 2);
  a.candidate.config.grad_accum = 6;  // interleaving takes micro-batches in groups of pp
  Result<Plan> g = parse_plan(plan_yaml(a), "plan.yaml", &p);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().find("training.grad_accum"), std::string::npos) << g.error();
  a.candidate.config.grad_accum = 16;
  a.candidate.config.virtual_stages = 1;
  a.gpus = 4;  // dp x mp without the stages
  Result<Plan> e = parse_plan(plan_yaml(a), "plan.yaml", &p);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().find("expected training.dp x training.mp x training.pp = 1 x 4 x 4 = 16, got 4"),
            std::string::npos)
      << e.error();
}

}  // namespace
}  // namespace memwall::planner
