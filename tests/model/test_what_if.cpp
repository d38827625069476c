// Seed 004's what-ifs against their closed forms: block-sparse attention scales the attention
// operators' FLOPs and Eq. 5's score term by the density and nothing else; 1-bit Adam shrinks each
// gradient collective to 1 bit per element plus one fp32 scale per piece and keeps 4 B of error
// feedback per parameter beside optim32. Tolerance: 1e-12 relative (the same arithmetic).
#include <gtest/gtest.h>

#include "model/analysis.hpp"
#include "model/schedule.hpp"

namespace memwall {
namespace {

bool is_attention(const Operator& o) {
  return o.kind == OpKind::attention_scores || o.kind == OpKind::attention_context;
}

TEST(WhatIfSparseAttention, AttentionFlopsScaleByDensityOtherOperatorsUnchanged) {
  const ModelSpec m = *load_model("table1-10B");
  for (double d : {1.0, 0.5, 0.1, 0.01}) {
    const OperatorGraph dense = build_gpt_graph(m, 2, 4096), sparse = build_gpt_graph(m, 2, 4096, d);
    EXPECT_NEAR(sparse.attention_flops() / (d * dense.attention_flops()), 1.0, 1e-12) << d;
    EXPECT_DOUBLE_EQ(sparse.linear_flops(), dense.linear_flops());
    ASSERT_EQ(sparse.size(), dense.size());
    for (size_t v = 0; v < dense.size(); ++v) {
      const Operator &a = dense.op(v), &b = sparse.op(v);
      const double f = is_attention(a) ? d : 1.0;
      EXPECT_DOUBLE_EQ(b.fwd_flops, f * a.fwd_flops) << a.name;
      EXPECT_DOUBLE_EQ(b.bwd_flops, f * a.bwd_flops) << a.name;
      EXPECT_DOUBLE_EQ(b.recompute_flops, f * a.recompute_flops) << a.name;
    }
  }
}

TEST(WhatIfSparseAttention, Eq5ScoreTermScalesByDensity) {
  const double bsz = 2, ci = 3, hd = 4096, heads = 32, seq = 8192, d = 0.1;
  const double linear_term = bsz * seq * ci * 16 * hd;            // bsz·seq·ci·16·hd
  const double score_term = bsz * seq * ci * 2 * heads * seq;     // bsz·seq·ci·2·heads·seq
  EXPECT_DOUBLE_EQ(awm_bytes_eq5(bsz, long(seq), int(ci), long(hd), int(heads)), linear_term + score_term);
  EXPECT_NEAR(awm_bytes_eq5(bsz, long(seq), int(ci), long(hd), int(heads), d) / (linear_term + d * score_term), 1.0,
              1e-12);
}

TEST(WhatIfSparseAttention, ScheduleHoldsEq5AtDensityAndComputesFewerFlops) {
  const ModelSpec m = *load_model("table1-10B");
  const HardwareProfile p = *load_profile("dgx2");
  TrainingConfig c;
  c.seq = m.seq;
  c.ci = 2;
  TrainingConfig sa = c;
  sa.what_if.attention_density = 0.25;
  const Schedule a = *build_schedule(m, *preset("zero3"), c, p), b = *build_schedule(m, *preset("zero3"), sa, p);
  EXPECT_TRUE(check_invariants(b).empty());
  auto segment_awm = [](const Schedule& s) {
    for (const Buffer& buf : s.buffers)
      if (buf.name == "awm:segment0") return buf.bytes;
    return 0.0;
  };
  EXPECT_NEAR(segment_awm(b) / awm_bytes_eq5(c.bsz, c.seq, c.ci, m.hidden, m.heads, 0.25), 1.0, 1e-12);
  EXPECT_NEAR(segment_awm(a) / awm_bytes_eq5(c.bsz, c.seq, c.ci, m.hidden, m.heads), 1.0, 1e-12);
  const OperatorGraph g = build_gpt_graph(m, c.bsz, c.seq);
  // One rank computes the whole model (dp only): the saving is 3/4 of attention's FLOPs.
  EXPECT_NEAR((a.compute_flops - b.compute_flops) / (0.75 * g.attention_flops()), 1.0, 1e-9);
}

// Every gradient collective of the 1-bit schedule against the same step of the plain one.
void expect_onebit(const std::string& strategy, int nodes) {
  const ModelSpec m = *load_model("table1-10B");
  const HardwareProfile p = *scale_to_nodes(*load_profile("dgx2"), nodes);
  TrainingConfig c;
  c.seq = m.seq;
  c.bsz = 2;
  c = *fit_to_profile(c, p);
  TrainingConfig ob = c;
  ob.what_if.onebit_adam = true;
  const Schedule a = *build_schedule(m, *preset(strategy), c, p), b = *build_schedule(m, *preset(strategy), ob, p);
  EXPECT_TRUE(check_invariants(b).empty());
  ASSERT_EQ(a.steps.size(), b.steps.size());
  const double dp = c.dp;
  int collectives = 0;
  for (size_t i = 0; i < a.steps.size(); ++i) {
    const Step &x = a.steps[i], &y = b.steps[i];
    ASSERT_EQ(x.kind, y.kind);
    const bool grad = x.state == State::grad16 && (x.kind == StepKind::reduce_scatter || x.kind == StepKind::allreduce);
    if (!grad) {
      EXPECT_DOUBLE_EQ(y.bytes, x.bytes) << x.op;
      continue;
    }
    ++collectives;
    // bf16 -> 1 bit is 1/16 of the bytes; one fp32 scale per peer (reduce-scatter) or per peer
    // and pass (all-reduce: gather and all-gather).
    const double pieces = (x.kind == StepKind::allreduce ? 2.0 : 1.0) * (dp - 1);
    EXPECT_NEAR(y.bytes / (x.bytes / 16 + 4 * pieces), 1.0, 1e-12) << x.op;
  }
  EXPECT_GT(collectives, 0);
  // Error feedback: 4 B per parameter of the optimizer shard, beside optim32 (16 B per parameter).
  const int t = int(Tier::gpu);  // zero3 and data_parallel keep optim32 on the GPU
  EXPECT_NEAR(b.persistent_bytes[t][int(State::optim32)] / (a.persistent_bytes[t][int(State::optim32)] * 20.0 / 16.0),
              1.0, 1e-12);
}

TEST(WhatIfOnebitAdam, ReduceScatterBytesAreOneSixteenthPlusScales) { expect_onebit("zero3", 4); }
TEST(WhatIfOnebitAdam, AllreduceBytesAreOneSixteenthPlusScales) { expect_onebit("data_parallel", 2); }

TEST(WhatIfOnebitAdam, EndToEndVolumeIsTheBlogsRatio) {
  // 1 / (warmup + (1 - warmup) / 16) with the blog's 15 % warm-up: about 4.9x ("up to 5x").
  const double ratio = 1.0 / onebit_end_to_end(1.0, onebit_bytes(1.0, 2.0, 0), 0.15);
  EXPECT_NEAR(ratio, 1.0 / (0.15 + 0.85 / 16), 1e-12);
  EXPECT_NEAR(ratio, 4.92, 0.01);
}

TEST(WhatIfRanges, BadDensityAndWarmupNameTheFlag) {
  TrainingConfig c;
  for (double d : {0.0, -0.5, 1.5}) {
    c.what_if.attention_density = d;
    Result<TrainingConfig> r = validate_ranges(c, 4);
    ASSERT_FALSE(r.ok()) << d;
    EXPECT_TRUE(r.error().starts_with("--attention-density: expected")) << r.error();
  }
  c.what_if.attention_density = 1;
  for (double w : {-0.1, 1.0}) {
    c.what_if.onebit_warmup = w;
    Result<TrainingConfig> r = validate_ranges(c, 4);
    ASSERT_FALSE(r.ok()) << w;
    EXPECT_TRUE(r.error().starts_with("--onebit-adam-warmup: expected")) << r.error();
  }
}

}  // namespace
}  // namespace memwall
