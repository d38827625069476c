// Plan files (write, load, file:line:field errors, cross-checks against a profile). The DeepSpeed
// export's tests are test_deepspeed.cpp.
#include <gtest/gtest.h>

#include "model/analysis.hpp"
#include "model/yaml_reader.hpp"
#include "planner/plan_file.hpp"
#include "planner/search.hpp"

namespace memwall::planner {
namespace {

Plan one_tb_plan() {
  HardwareProfile p = *load_profile("dgx2");
  ModelSpec m = *load_model("table1-1T");
  SearchResult r = search(m, p, *make_space(m, p, {}));
  EXPECT_TRUE(r.fits());
  Plan plan;
  plan.profile = p.name;
  plan.nodes = 1;
  plan.model = m;
  plan.candidate = r.ranked.front().candidate;
  plan.candidate.placement.name = placement_label(plan.candidate.placement);
  plan.gpus = plan.candidate.config.dp * plan.candidate.config.mp;
  plan.predicted_iteration_s = r.ranked.front().time.iteration_s;
  plan.predicted_tflops_per_gpu = r.ranked.front().time.tflops_per_gpu;
  return plan;
}

TEST(PlanFile, RoundTrip) {
  Plan a = one_tb_plan();
  HardwareProfile p = *load_profile("dgx2");
  Result<Plan> b = parse_plan(plan_yaml(a), "plan.yaml", &p);
  ASSERT_TRUE(b.ok()) << b.error();
  EXPECT_EQ(b->profile, "dgx2");
  EXPECT_EQ(b->gpus, 16);
  EXPECT_EQ(b->model.layers, 128);
  EXPECT_EQ(b->model.hidden, 25600);
  EXPECT_EQ(b->model.heads, 256);
  for (State s : {State::param16, State::grad16, State::optim32, State::act_ckpt}) {
    EXPECT_EQ(b->candidate.placement.of(s).tier, a.candidate.placement.of(s).tier);
    EXPECT_EQ(b->candidate.placement.of(s).partitioned, a.candidate.placement.of(s).partitioned);
  }
  EXPECT_EQ(b->candidate.config.bsz, a.candidate.config.bsz);
  EXPECT_EQ(b->candidate.config.ci, a.candidate.config.ci);
  EXPECT_EQ(b->candidate.config.tiling_factor, a.candidate.config.tiling_factor);
  EXPECT_EQ(b->candidate.config.dp, 16);
  EXPECT_NEAR(b->predicted_tflops_per_gpu, a.predicted_tflops_per_gpu, 0.01);
  // Loaded plans evaluate like the planned candidate.
  EXPECT_TRUE(evaluate(b->model, b->candidate, p).fit.fits());
  EXPECT_EQ(plan_yaml(*b).substr(plan_yaml(*b).find("model:")), plan_yaml(a).substr(plan_yaml(a).find("model:")));
}

// Names are whatever a model file or a profile path says: a model named "a: b #c" was written
// unquoted and the plan file it made did not load ("illegal map value"). Written as YAML scalars,
// each reads back as it was.
TEST(PlanFile, NamesWithYamlSyntaxRoundTrip) {
  HardwareProfile p = *load_profile("dgx2");
  const Plan base = one_tb_plan();
  for (const std::string name : {"a: b #c", "quote \" and \\ back", "tab\tnew\nline \x01\x7f", "- [x] {y}", "&anchor *alias",
                                 "true", "", "llama3-8B", "custom(param16=gpu,grad16=cpu/p)"}) {
    SCOPED_TRACE(one_line(name));
    Plan a = base;
    a.model.name = name;
    a.candidate.placement.name = name.empty() ? "custom" : name;
    Result<Plan> b = parse_plan(plan_yaml(a), "plan.yaml", &p);
    ASSERT_TRUE(b.ok()) << b.error();
    EXPECT_EQ(b->model.name, name);
    EXPECT_EQ(b->candidate.placement.name, a.candidate.placement.name);
  }
  EXPECT_EQ(yaml_scalar("llama3-8B"), "llama3-8B");  // plain where plain is safe
  EXPECT_EQ(yaml_scalar("a: b"), "\"a: b\"");
}

// Replaces the first occurrence of `from` in the written 1T plan.
std::string edited(const std::string& from, const std::string& to) {
  std::string y = plan_yaml(one_tb_plan());
  auto at = y.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return y.replace(at, from.size(), to);
}

std::string error_of(const std::string& yaml, bool with_profile = true) {
  HardwareProfile p = *load_profile("dgx2");
  Result<Plan> r = parse_plan(yaml, "bad.yaml", with_profile ? &p : nullptr);
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : r.error();
}

TEST(PlanFile, BadFilesNameFileLineAndField) {
  // Line numbers of the written plan: 2 version, 3 profile, 4 nodes, 5 gpus, ...
  EXPECT_EQ(error_of(edited("gpus: 16", "gpus: 32")).substr(0, 20), "bad.yaml:5: gpus: ex");  // != dp x mp
  EXPECT_NE(error_of(edited("gpus: 16", "gpus: 8")).find("expected training.dp x training.mp = 16 x 1 = 16, got 8"),
            std::string::npos);
  EXPECT_NE(error_of(edited("  dp: 16", "  colour: 16")).find("training.colour: unknown field"), std::string::npos);
  EXPECT_NE(error_of(edited("tier: nvme", "tier: disk")).find("placement.param16.tier: expected a tier"),
            std::string::npos);
  EXPECT_NE(error_of(edited("layers: 128", "layers: 1")).find("training.ci: expected an integer from 1 to 1, got"),
            std::string::npos);
  // Found in issue 16: a tiling factor of a million passed `plan --check` and grew to gigabytes.
  EXPECT_NE(error_of(edited("tiling_factor: ", "tiling_factor: 1000000 #")).find(
                "training.tiling_factor: expected an integer from 1 to 4096, got \"1000000\""),
            std::string::npos);
  EXPECT_NE(error_of(edited("  dp: 16", "  dp: 4294967312")).find("training.dp: expected an integer from 1 to"),
            std::string::npos);
  EXPECT_NE(error_of(edited("bsz: ", "bsz: inf #")).find("training.bsz: expected a number > 0 and at most 65536"),
            std::string::npos);
  EXPECT_NE(error_of(edited("  dp: 16", "  dp: 16\n  dp: 8")).find("training.dp: given twice"), std::string::npos);
  EXPECT_NE(error_of(edited("bsz: ", "bsz: -")).find("training.bsz"), std::string::npos);
  EXPECT_NE(error_of(edited("grad16: {tier: nvme", "grad16: {tier: cpu")).find("placement: placement"),
            std::string::npos);
  EXPECT_NE(error_of("version: 1\n").find("bad.yaml:1: profile: missing field"), std::string::npos);
  EXPECT_NE(error_of("version: [1\n").find("malformed YAML"), std::string::npos);
}

// Issue 17: with --simulate-top the plan file says which ranking chose the plan and keeps the
// simulated time beside the analytic one; both survive a round trip, and a claim of a simulated
// ranking without a simulated time is refused.
TEST(PlanFile, RankingAndSimulatedTimeRoundTrip) {
  Plan a = one_tb_plan();
  EXPECT_NE(plan_yaml(a).find("ranking: analytic"), std::string::npos);
  EXPECT_EQ(plan_yaml(a).find("simulated_iteration_s"), std::string::npos);
  a.ranking = "simulated";
  a.simulated_iteration_s = 12.5;
  a.simulated_tflops_per_gpu = 31.25;
  HardwareProfile p = *load_profile("dgx2");
  Result<Plan> b = parse_plan(plan_yaml(a), "plan.yaml", &p);
  ASSERT_TRUE(b.ok()) << b.error();
  EXPECT_EQ(b->ranking, "simulated");
  ASSERT_TRUE(b->simulated_iteration_s.has_value());
  EXPECT_DOUBLE_EQ(*b->simulated_iteration_s, 12.5);
  EXPECT_DOUBLE_EQ(*b->simulated_tflops_per_gpu, 31.25);
  EXPECT_NEAR(b->predicted_iteration_s, a.predicted_iteration_s, 1e-3);
  EXPECT_NE(error_of(edited("ranking: analytic", "ranking: simulated")).find(
                "predicted.ranking: simulated, but no predicted.simulated_iteration_s"),
            std::string::npos);
  EXPECT_NE(error_of(edited("ranking: analytic", "ranking: fastest")).find("predicted.ranking: expected analytic or simulated"),
            std::string::npos);
}

TEST(PlanFile, TensorSlicingDividesTheNode) {
  std::string y = edited("gpus: 16", "gpus: 15");
  y = y.replace(y.find("  dp: 16"), 8, "  dp: 5");
  y = y.replace(y.find("  mp: 1"), 7, "  mp: 3");
  EXPECT_NE(error_of(y).find("training.mp: expected a divisor of the node's 16 GPUs"), std::string::npos) << error_of(y);
}

TEST(PlanFile, CrossChecksAgainstTheProfile) {
  // A plan for 32 GPUs (dp 32) against the 16-GPU DGX-2.
  std::string y = edited("gpus: 16", "gpus: 32");
  y = y.replace(y.find("  dp: 16"), 8, "  dp: 32");
  EXPECT_TRUE(parse_plan(y, "bad.yaml", nullptr).ok());
  EXPECT_EQ(error_of(y), "bad.yaml:5: gpus: plan names 32 GPUs, profile dgx2 has 16");
  EXPECT_NE(error_of(edited("nodes: 1", "nodes: 2")).find("bad.yaml:4: nodes: plan names 2 node(s), profile dgx2 has 1"),
            std::string::npos);
  EXPECT_NE(error_of(edited("profile: dgx2", "profile: dgx-a100")).find("bad.yaml:3: profile: plan was made for"),
            std::string::npos);
}

}  // namespace
}  // namespace memwall::planner
