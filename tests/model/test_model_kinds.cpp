// Today's model kinds (grouped-query attention, gated feed-forward, RMSNorm, rotary positions,
// untied embeddings, mixture of experts) against their references: the parameter counts model
// authors publish, the closed forms of each kind, the paper's Eq. 1-11 as the special case of the
// paper's GPT, and Hugging Face config.json files written from the published ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <thread>

#include "model/analysis.hpp"
#include "model/memory.hpp"
#include "model/model_spec.hpp"
#include "model/operator_graph.hpp"
#include "model/schedule.hpp"
#include "model/throughput.hpp"

namespace memwall {
namespace {

std::string config_path(const std::string& file) {
  return std::string(MEMWALL_SOURCE_DIR) + "/tests/model/hf_configs/" + file;
}

std::string read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const Operator& op_named(const OperatorGraph& g, const std::string& name) {
  for (size_t v : g.order)
    if (g.op(v).name == name) return g.op(v);
  throw std::runtime_error("no operator " + name);
}

// Every catalogue model with a published count is within 0.5 % of it (and its active count too);
// the counts walk the graph, so the graph's operators are what is checked.
TEST(ModelKinds, CatalogueCountsAreThePublishedOnes) {
  int checked = 0;
  for (const CatalogueEntry& e : model_catalogue()) {
    if (e.published_params <= 0) continue;
    const OperatorGraph g = build_gpt_graph(e.spec, 1, e.spec.seq);
    EXPECT_NEAR(g.param_elems() / e.published_params, 1.0, 0.005) << e.spec.name << " " << g.param_elems();
    if (e.published_active_params > 0) {
      EXPECT_NEAR(g.active_param_elems() / e.published_active_params, 1.0, 0.005) << e.spec.name;
    }
    // the closed form the planner uses is the graph's sum
    EXPECT_NEAR(model_param_count(e.spec), g.param_elems(), 1e-9 * g.param_elems()) << e.spec.name;
    EXPECT_NEAR(active_param_count(e.spec), g.active_param_elems(), 1e-9 * g.param_elems()) << e.spec.name;
    ++checked;
  }
  EXPECT_EQ(checked, 8);
  // exact where the count is published to the parameter
  EXPECT_DOUBLE_EQ(model_param_count(*load_model("gpt2-124M")), 124439808.0);
  EXPECT_NEAR(model_param_count(*load_model("llama3-8B")), 8030261248.0, 0.5);
}

// The paper's models are the paper's GPT, and every generalised quantity equals its equation.
TEST(ModelKinds, PaperGptIsTheSpecialCaseOfEq1To11) {
  for (const CatalogueEntry& e : model_catalogue()) {
    const ModelSpec& m = e.spec;
    if (e.published_params > 0 && m.name != "gpt2-124M" && m.name != "gpt3-175B") {
      EXPECT_FALSE(m.paper_gpt()) << m.name;
      continue;
    }
    ASSERT_TRUE(m.paper_gpt()) << m.name;
    EXPECT_DOUBLE_EQ(mswm_bytes(m), mswm_bytes_eq4(m.hidden)) << m.name;
    EXPECT_DOUBLE_EQ(awm_bytes(m, 4, 1024, 2), awm_bytes_eq5(4, 1024, 2, m.hidden, m.heads)) << m.name;
    EXPECT_DOUBLE_EQ(awm_bytes(m, 4, 1024, 1, 0.25), awm_bytes_eq5(4, 1024, 1, m.hidden, m.heads, 0.25)) << m.name;
    EXPECT_DOUBLE_EQ(ait_act_ckpt(m, 3), ait_act_ckpt_eq11(m.hidden, 3)) << m.name;
    EXPECT_DOUBLE_EQ(active_weight_share(m), 1.0);
    EXPECT_DOUBLE_EQ(active_block_weight_elems(m) * m.layers, params_eq1(m.layers, m.hidden)) << m.name;
    TrainingConfig c;
    const Analysis a = analyze(m, c, *load_profile("dgx2"), 16);
    EXPECT_DOUBLE_EQ(a.params, params_eq1(m.layers, m.hidden));
    EXPECT_DOUBLE_EQ(a.model_state_bytes, model_state_bytes_eq2(m.layers, m.hidden));
    EXPECT_DOUBLE_EQ(a.ait_param_grad, ait_param_grad_eq9(c.bsz, c.seq));
  }
}

ModelSpec llama_like(int kv_heads, long intermediate) {
  ModelSpec m = *model_from_shape(4, 2048, 16, 1024, 32000);
  m.kv_heads = kv_heads;
  m.ffn = FfnKind::swiglu;
  m.intermediate = intermediate;
  m.norm = NormKind::rmsnorm;
  m.positions = PositionKind::rotary;
  m.tied_embeddings = false;
  m.bias = BiasKind::none;
  return m;
}

TEST(ModelKinds, ClosedFormsOfEachKind) {
  const long C = 2048, I = 5632;
  const ModelSpec mha = llama_like(16, I), gqa = llama_like(4, I), mqa = llama_like(1, I);
  const OperatorGraph g_mha = build_gpt_graph(mha, 2, 1024), g_gqa = build_gpt_graph(gqa, 2, 1024),
                      g_mqa = build_gpt_graph(mqa, 2, 1024);
  // GQA shrinks the K and V projections by heads / kv_heads, and the K and V activations read
  const double kv_mha = op_named(g_mha, "block0.qkv").param_elems - double(C) * C;
  const double kv_gqa = op_named(g_gqa, "block0.qkv").param_elems - double(C) * C;
  EXPECT_DOUBLE_EQ(kv_mha / kv_gqa, 16.0 / 4);
  EXPECT_DOUBLE_EQ(op_named(g_mqa, "block0.qkv").param_elems, double(C) * C + 2.0 * C * (C / 16));
  const double kv_act_mha = op_named(g_mha, "block0.attn_context").act_read_bytes -
                            op_named(g_mha, "block0.attn_scores").act_write_bytes;
  const double kv_act_gqa = op_named(g_gqa, "block0.attn_context").act_read_bytes -
                            op_named(g_gqa, "block0.attn_scores").act_write_bytes;
  EXPECT_DOUBLE_EQ(kv_act_mha / kv_act_gqa, 4.0);
  // the scores are per query head: the same FLOPs
  EXPECT_DOUBLE_EQ(op_named(g_mha, "block0.attn_scores").fwd_flops, op_named(g_gqa, "block0.attn_scores").fwd_flops);
  // SwiGLU with intermediate I: 3·hd·I feed-forward parameters (no biases), RMSNorm C, untied head V·C
  EXPECT_DOUBLE_EQ(op_named(g_gqa, "block0.fc1").param_elems + op_named(g_gqa, "block0.fc2").param_elems,
                   3.0 * C * I);
  EXPECT_DOUBLE_EQ(op_named(g_gqa, "block0.ln1").param_elems, double(C));
  EXPECT_DOUBLE_EQ(op_named(g_gqa, "lm_head").param_elems, 32000.0 * C);
  EXPECT_EQ(op_named(g_gqa, "lm_head").param_owner, "lm_head");
  EXPECT_DOUBLE_EQ(op_named(g_gqa, "embed").param_elems, 32000.0 * C);  // rotary: no position table
  // a geglu of the same size has the same parameters; gelu (ungated) two thirds of them
  ModelSpec geglu = gqa, gelu = gqa;
  geglu.ffn = FfnKind::geglu;
  gelu.ffn = FfnKind::gelu;
  EXPECT_DOUBLE_EQ(model_param_count(geglu), model_param_count(gqa));
  EXPECT_DOUBLE_EQ(model_param_count(gqa) - model_param_count(gelu), 4.0 * C * I);
  // a sliding window of a quarter of the sequence computes a quarter of the scores
  ModelSpec window = gqa;
  window.attention_window = 256;
  EXPECT_DOUBLE_EQ(op_named(build_gpt_graph(window, 2, 1024), "block0.attn_scores").fwd_flops * 4,
                   op_named(g_gqa, "block0.attn_scores").fwd_flops);
}

TEST(ModelKinds, MixtureOfExpertsComputesWithTheRoutedAndStoresEveryExpert) {
  ModelSpec moe = llama_like(4, 0);
  moe.moe = {8, 2, 5632, 0};
  ModelSpec top1 = moe, wider = moe;
  top1.moe.experts_per_token = 1;
  wider.moe.experts = 16;
  const OperatorGraph g2 = build_gpt_graph(moe, 2, 1024), g1 = build_gpt_graph(top1, 2, 1024),
                      g16 = build_gpt_graph(wider, 2, 1024);
  // FLOPs of the experts scale with experts per token, not with experts
  EXPECT_DOUBLE_EQ(op_named(g2, "block0.fc1").fwd_flops, 2 * op_named(g1, "block0.fc1").fwd_flops);
  EXPECT_DOUBLE_EQ(op_named(g16, "block0.fc1").fwd_flops, op_named(g2, "block0.fc1").fwd_flops);
  // memory with every expert
  EXPECT_DOUBLE_EQ(op_named(g16, "block0.fc1").param_elems, 2 * op_named(g2, "block0.fc1").param_elems);
  EXPECT_DOUBLE_EQ(op_named(g2, "block0.fc1").param_elems, op_named(g1, "block0.fc1").param_elems);
  EXPECT_DOUBLE_EQ(op_named(g2, "block0.router").param_elems, 2048.0 * 8);
  const double expert = 3.0 * 2048 * 5632;
  EXPECT_NEAR(g2.param_elems() - g2.active_param_elems(), 4 * 6 * expert, 1e-6 * expert);
  // Eq. 9's intensity falls by the routed share: every weight is fetched, a quarter computes
  EXPECT_NEAR(active_weight_share(moe), (op_named(g2, "block0.qkv").weight_elems + 2048.0 * 2048 + 2048 * 8 +
                                         2 * expert) /
                                            (op_named(g2, "block0.qkv").weight_elems + 2048.0 * 2048 + 2048 * 8 +
                                             8 * expert),
              1e-12);
}

// A mixture of experts' layer is fetched, computed and offloaded one expert at a time (each
// expert its own parameter units, as DeepSpeed fetches each expert module): the schedule's fetches
// and computes name the experts, the FLOPs split evenly, and no fetched buffer holds more than one
// expert's tile.
TEST(ModelKinds, ExpertsAreFetchedOneAtATime) {
  ModelSpec moe = llama_like(4, 0);
  moe.moe = {8, 2, 2816, 0};
  TrainingConfig c;
  c.seq = moe.seq;
  c.bsz = 2;
  c.dp = 16;
  c.tiling_factor = 2;
  const std::vector<ParamUnit> units = param_units(moe, c);
  int fc1 = 0;
  for (const ParamUnit& u : units)
    if (u.block == 0 && u.role == OpRole::fc1) ++fc1;
  EXPECT_EQ(fc1, 16);  // 8 experts x 2 tiles
  EXPECT_TRUE(std::any_of(units.begin(), units.end(),
                          [](const ParamUnit& u) { return u.name == "block0.fc1[expert 7 tile 1]"; }));
  const HardwareProfile p = *load_profile("dgx2");
  const Schedule s = *build_schedule(moe, *preset("zero3"), c, p);
  const OperatorGraph g = build_gpt_graph(moe, c.bsz, c.seq);
  const Operator& fc1_op = op_named(g, "block0.fc1");
  double fc1_flops = 0, largest_fetch = 0;
  for (const Step& st : s.steps) {
    if (st.kind == StepKind::compute && st.phase == Phase::forward && st.name == "block0.fc1") fc1_flops += st.flops;
    if (st.kind == StepKind::fetch && st.name.starts_with("block0.fc")) largest_fetch = std::max(largest_fetch, st.bytes);
  }
  EXPECT_NEAR(fc1_flops, fc1_op.fwd_flops, 1e-9 * fc1_flops);
  EXPECT_GT(largest_fetch, 0);
  EXPECT_LE(largest_fetch, 2.0 * fc1_op.param_elems / 16);  // one expert's tile, 16-bit
}

// Expert parallelism (ep): each rank holds E / ep of the routed experts, partitioned over the
// dp / ep ranks holding the same ones (so a rank keeps the same share of every state as with ep 1),
// and the tokens cross the expert-parallel group all-to-all: twice per MoE block in forward, twice
// in recompute, twice in backward, each receiving (ep - 1) / ep of tokens x top-k x hidden
// activations. The memory model predicts the schedule's walked peaks; what is not modelled is refused.
TEST(ModelKinds, ExpertParallelismExchangesTokensAllToAll) {
  ModelSpec moe = llama_like(4, 0);
  moe.moe = {8, 2, 2816, 0};
  const HardwareProfile p = *load_profile("dgx2");
  for (const char* pn : {"zero3", "zero_inf_cpu", "zero_inf_nvme", "data_parallel"})
    for (int ep : {2, 4, 8}) {
      const Placement pl = *preset(pn);
      TrainingConfig c;
      c.seq = moe.seq;
      c.bsz = 2;
      c.dp = 16;
      c.ep = ep;
      const std::string what = std::string(pn) + " ep " + std::to_string(ep);
      Result<Schedule> s = build_schedule(moe, pl, c, p);
      ASSERT_TRUE(s.ok()) << what << ": " << s.error();
      EXPECT_TRUE(check_invariants(*s).empty()) << what << ": " << check_invariants(*s).front();
      const double send = 2.0 * c.bsz * c.seq * 2 * moe.hidden;  // fp16 x tokens x top-2 x hidden
      double a2a = 0;
      int steps = 0;
      for (const Step& st : s->steps)
        if (st.kind == StepKind::all_to_all) {
          ++steps;
          a2a += st.bytes;
          EXPECT_EQ(st.collective.group, CommGroup::ep);
          EXPECT_EQ(st.collective.members, ep);
          EXPECT_DOUBLE_EQ(st.collective.bytes_per_rank, send);
        }
      EXPECT_EQ(steps, 6 * moe.layers) << what;
      EXPECT_NEAR(a2a, 6.0 * moe.layers * send * (ep - 1) / ep, 1e-6 * a2a) << what;
      // this rank's experts: E / ep of them, gathered and reduced over dp / ep ranks
      int expert_units = 0;
      for (const ScheduleUnit& u : s->units)
        if (u.block == 0 && u.role == OpRole::fc1) {
          ++expert_units;
          EXPECT_TRUE(u.expert);
          EXPECT_DOUBLE_EQ(u.shard, u.elems / (16 / ep));
        }
      EXPECT_EQ(expert_units, 8 / ep);
      for (const Step& st : s->steps)
        if (st.kind == StepKind::fetch && st.hop == Hop::gg && st.name.starts_with("block0.fc1")) {
          EXPECT_EQ(st.collective.group, CommGroup::edp) << what;
        }
      // partitioned, every state's share per rank is ep 1's; kept whole (data_parallel), a rank
      // keeps only its E / ep experts' share
      TrainingConfig one = c;
      one.ep = 1;
      const Schedule s1 = *build_schedule(moe, pl, one, p);
      const double experts = moe.layers * 8 * 3.0 * moe.hidden * 2816;  // every block's experts, fc1 + fc2
      for (int t = 0; t < kTiers; ++t)
        for (int st = 0; st < 4; ++st) {
          const StatePlacement& sp = pl.of(State(st));
          const double bytes_per = st == int(State::optim32) ? MemorySizes{}.optim_bytes : MemorySizes{}.param_bytes;
          const bool param_state = State(st) != State::act_ckpt;
          const double fewer =
              !param_state || sp.partitioned || sp.tier != Tier(t) ? 0 : bytes_per * experts * (1 - 1.0 / ep);
          const double want = s1.persistent_bytes[size_t(t)][size_t(st)] - fewer;
          EXPECT_NEAR(s->persistent_bytes[size_t(t)][size_t(st)], want, 1e-9 * (1 + want)) << what << " state " << st;
        }
      // the optimizer's chunks cover this rank's whole optimizer partition, experts' shards included
      double chunked = 0, updated = 0;
      for (const ScheduleChunk& k : s->optimizer_chunks) chunked += k.params;
      for (const Step& st : s->steps)
        if (st.kind == StepKind::optimizer) updated += st.params;
      const double partition = s->persistent_bytes[int(pl.optim32.tier)][int(State::optim32)] / MemorySizes{}.optim_bytes;
      EXPECT_NEAR(chunked, partition, 1e-6 * partition) << what;
      EXPECT_NEAR(updated, partition, 1e-6 * partition) << what;
      const MemoryModel mm = memory_model(moe, pl, c, p);
      EXPECT_NEAR(mm.of(Tier::gpu).peak_bytes, s->peak_bytes[int(Tier::gpu)], 0.03 * s->peak_bytes[int(Tier::gpu)]) << what;
      EXPECT_NEAR(mm.of(Tier::cpu).peak_bytes, s->peak_bytes[int(Tier::cpu)], 0.03 * s->peak_bytes[int(Tier::cpu)]) << what;
    }
  // what is not modelled, refused with the flag
  TrainingConfig c;
  c.seq = moe.seq;
  c.dp = 16;
  c.ep = 3;
  EXPECT_NE(build_schedule(moe, *preset("zero3"), c, p).error().find("--ep: expected a divisor of the model's 8 experts"),
            std::string::npos);
  c.ep = 2;
  EXPECT_NE(build_schedule(moe, *preset("zero2"), c, p).error().find("--ep: whole 16-bit parameters"), std::string::npos);
  EXPECT_NE(build_schedule(moe, *preset("zero_offload"), c, p).error().find("--ep: the broadcast fetch"),
            std::string::npos);
  EXPECT_NE(build_schedule(llama_like(4, 5632), *preset("zero3"), c, p).error().find("has no experts"), std::string::npos);
}

// Each supported architecture's config.json loads with the published count; what memwall does
// not model is refused by name.
TEST(ModelKinds, HuggingFaceConfigsLoad) {
  struct Case {
    const char* file;
    double published, active;
  };
  for (const Case& k : {Case{"llama3-8b.json", 8.03e9, 0}, Case{"mistral-7b.json", 7.24e9, 0},
                        Case{"mixtral-8x7b.json", 46.7e9, 12.9e9}, Case{"qwen2-72b.json", 72.7e9, 0},
                        Case{"gpt2.json", 124e6, 0}, Case{"gpt-neox-20b.json", 20554567680.0, 0},
                        Case{"mistral-nemo-12b.json", 12.2e9, 0}}) {
    Result<ModelSpec> m = load_model(config_path(k.file));
    ASSERT_TRUE(m.ok()) << k.file << ": " << m.error();
    EXPECT_NEAR(model_param_count(*m) / k.published, 1.0, 0.005) << k.file;
    if (k.active > 0) {
      EXPECT_NEAR(active_param_count(*m) / k.active, 1.0, 0.005) << k.file;
    }
  }
  EXPECT_DOUBLE_EQ(model_param_count(*load_model(config_path("gpt-neox-20b.json"))), 20554567680.0);
  // the config's model is the catalogue's
  const ModelSpec from_json = *load_model(config_path("llama3-8b.json"));
  const ModelSpec cat = *load_model("llama3-8B");
  EXPECT_EQ(model_yaml(from_json, "").substr(model_yaml(from_json, "").find('\n')),
            model_yaml(cat, "").substr(model_yaml(cat, "").find('\n')));
  const ModelSpec mistral = *load_model(config_path("mistral-7b.json"));
  EXPECT_EQ(mistral.attention_window, 4096);
  EXPECT_EQ(mistral.seq, 8192);  // the config's 32768, capped, and said
  EXPECT_NE(mistral.note.find("32768"), std::string::npos);
  EXPECT_EQ(load_model(config_path("qwen2-72b.json"))->bias, BiasKind::qkv);
  // an explicit head size: q and the attention projection are heads x head_dim = 4096 wide, not 5120
  const ModelSpec nemo = *load_model(config_path("mistral-nemo-12b.json"));
  EXPECT_EQ(nemo.head_dim(), 128);
  EXPECT_EQ(nemo.attention_width(), 4096);
  EXPECT_NE(nemo.kind_words().find("head size 128"), std::string::npos) << nemo.kind_words();
  const double C = 5120, A = 32 * 128, KV = 8 * 128, I = 14336, V = 131072;
  const double per_layer = C * A + 2 * C * KV + A * C + 3 * C * I + 2 * C;  // q, k and v, o, gate/up/down, norms
  EXPECT_DOUBLE_EQ(model_param_count(nemo), 40 * per_layer + 2 * V * C + C);  // 12,247,782,400
  // the attention's FLOPs follow the 4096 channels: 2 B T^2 A per operator
  const OperatorGraph g = build_gpt_graph(nemo, 1, 1024);
  for (std::size_t v : g.order)
    if (g.op(v).role == OpRole::attn_scores && g.op(v).block == 0) {
      EXPECT_DOUBLE_EQ(g.op(v).fwd_flops, 2.0 * 1024 * 1024 * A);
    }
  // and a model YAML carries it
  const ModelSpec back = *parse_model_spec(model_yaml(nemo, ""), "nemo.yaml");
  EXPECT_EQ(back.head_dim(), 128);
  EXPECT_DOUBLE_EQ(model_param_count(back), model_param_count(nemo));
}

TEST(ModelKinds, ConfigsWithWhatIsNotModelledAreRefusedByName) {
  const std::string llama = read(config_path("llama3-8b.json"));
  auto with = [&](const std::string& from, const std::string& to) {
    std::string s = llama;
    s.replace(s.find(from), from.size(), to);
    return parse_hf_config(s, "config.json");
  };
  Result<ModelSpec> r = with("\"model_type\": \"llama\"", "\"model_type\": \"mamba\"");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("config.json:12: model_type: "), std::string::npos) << r.error();
  EXPECT_NE(r.error().find("\"mamba\" is not one of them"), std::string::npos) << r.error();
  r = with("\"use_cache\": true", "\"num_local_experts\": 8");  // a field llama does not have
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("num_local_experts: unknown field"), std::string::npos) << r.error();
  r = with("\"attention_bias\": false", "\"mlp_bias\": true");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("mlp_bias: biases in the MLP"), std::string::npos) << r.error();
  r = with("\"num_key_value_heads\": 8", "\"num_key_value_heads\": 5");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("num_key_value_heads: expected a divisor of num_attention_heads 32"), std::string::npos)
      << r.error();
  r = with("\"hidden_act\": \"silu\"", "\"hidden_act\": \"relu\"");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("hidden_act: expected silu"), std::string::npos) << r.error();
  // sliding windows on some layers only (Qwen2's use_sliding_window) are not modelled
  std::string qwen = read(config_path("qwen2-72b.json"));
  qwen.replace(qwen.find("\"use_sliding_window\": false"), 27, "\"use_sliding_window\": true");
  r = parse_hf_config(qwen, "qwen.json");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("qwen.json:23: use_sliding_window: a sliding window on the layers above"), std::string::npos)
      << r.error();
  EXPECT_FALSE(parse_hf_config("{\"model_type\": \"llama\"", "cut.json").ok());  // not JSON
}

TEST(ModelKinds, ModelYamlCarriesEveryKindAndRoundTrips) {
  for (const char* name : {"mixtral-8x7B", "qwen2-72B", "mistral-7B", "table1-10B"}) {
    const ModelSpec m = *load_model(name);
    const std::string yaml = model_yaml(m, "");
    Result<ModelSpec> back = parse_model_spec(yaml, "m.yaml");
    ASSERT_TRUE(back.ok()) << name << ": " << back.error() << "\n" << yaml;
    EXPECT_EQ(model_yaml(*back, ""), yaml);
    EXPECT_DOUBLE_EQ(model_param_count(*back), model_param_count(m));
  }
  EXPECT_EQ(model_yaml(*load_model("table1-10B"), "").find("ffn"), std::string::npos);  // paper models: 6 lines
  Result<ModelSpec> bad = parse_model_spec("layers: 2\nhidden: 1024\nheads: 8\nffn: relu\n", "m.yaml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("m.yaml:4: ffn: expected one of gelu, swiglu, geglu, got \"relu\""), std::string::npos)
      << bad.error();
  bad = parse_model_spec("layers: 2\nhidden: 1024\nheads: 8\nkv_heads: 3\n", "m.yaml");
  EXPECT_NE(bad.error().find("m.yaml:4: kv_heads: expected a divisor of heads 8"), std::string::npos) << bad.error();
  bad = parse_model_spec("layers: 2\nhidden: 1024\nheads: 8\nmoe: {experts: 4, experts_per_token: 5, expert_intermediate: 8}\n",
                         "m.yaml");
  EXPECT_NE(bad.error().find("m.yaml:4: moe.experts_per_token: expected an integer from 1 to 4"), std::string::npos)
      << bad.error();
}

// The schedule of a Llama-shaped and a Mixtral-shaped model builds, passes its invariants, and
// holds exactly the graph's parameters; the memory model predicts its walked peaks.
TEST(ModelKinds, SchedulesAndMemoryHandleEveryKind) {
  ModelSpec moe = llama_like(4, 0);
  moe.moe = {4, 2, 2816, 0};
  const HardwareProfile p = *load_profile("dgx2");
  int cases = 0;
  for (const ModelSpec& m : {llama_like(4, 5632), moe})
    for (const std::string& pn : preset_names())
      for (int t : {1, 2})
        for (int ci : {1, 2}) {
          const Placement pl = *preset(pn);
          TrainingConfig c;
          c.seq = m.seq;
          c.bsz = 2;
          c.ci = ci;
          c.tiling_factor = t;
          if (pl.layer_major) c.micro_batches = 2;
          if (pn == "three_d") c.mp = 4;
          c = *fit_to_profile(c, p);
          Result<Schedule> s = build_schedule(m, pl, c, p);
          const std::string what = std::string(m.is_moe() ? "moe " : "llama ") + pn + " tiling " + std::to_string(t) +
                                   " ci " + std::to_string(ci);
          ++cases;
          ASSERT_TRUE(s.ok()) << what << ": " << s.error();
          EXPECT_TRUE(check_invariants(*s).empty()) << what << ": " << check_invariants(*s).front();
          double units = 0, graph = 0;
          for (const ParamUnit& u : param_units(m, c)) units += u.elems;
          const OperatorGraph g = build_gpt_graph(m, 1, m.seq);
          for (size_t v : g.order) graph += g.op(v).param_elems / (g.op(v).kind == OpKind::layernorm ? 1 : c.mp);
          EXPECT_NEAR(units, graph, 1e-9 * units) << what;
          const MemoryModel mm = memory_model(m, pl, c, p);
          EXPECT_NEAR(mm.of(Tier::gpu).peak_bytes, s->peak_bytes[int(Tier::gpu)], 0.03 * s->peak_bytes[int(Tier::gpu)])
              << what;
          EXPECT_NEAR(mm.of(Tier::cpu).peak_bytes, s->peak_bytes[int(Tier::cpu)], 0.03 * s->peak_bytes[int(Tier::cpu)])
              << what;
        }
  EXPECT_GT(cases, 30);
}

// The memory model remembers optimizer chunk layouts per shape; a Llama of a GPT's layers, hidden
// size and vocabulary has other units, so it must not get the GPT's (predicted in a fresh thread,
// whose cache is empty, as the reference).
TEST(ModelKinds, MemoryModelCacheTellsKindsApart) {
  HardwareProfile p = *load_profile("dgx2");
  p.pinned_budget_bytes = 4.0 * (1 << 30);  // chunks sized by the pinned budget: the same target for both
  ModelSpec llama = llama_like(40, 5632);
  llama.layers = 40;
  llama.hidden = 8192;
  llama.heads = 64;
  llama.kv_heads = 8;
  llama.intermediate = 28672;
  const ModelSpec gpt = *model_from_shape(llama.layers, llama.hidden, llama.heads, llama.seq, llama.vocab);
  TrainingConfig c;
  c.seq = llama.seq;
  c.dp = 16;
  const Placement pl = *preset("zero_inf_nvme");
  c.optimizer_overlap = OptimizerOverlap::none;
  auto chunk_buffers = [&](const ModelSpec& m) {
    const MemoryModel mm = memory_model(m, pl, c, p);
    for (const MemoryPart& part : mm.of(Tier::cpu).parts)
      if (part.what.starts_with("optimizer chunk buffers")) return part.bytes;
    return -1.0;
  };
  const double gpt_chunks = chunk_buffers(gpt);  // fills the cache
  const double llama_chunks = chunk_buffers(llama);
  double fresh = 0;
  std::thread([&] { fresh = chunk_buffers(llama); }).join();
  ASSERT_GT(fresh, 0);
  EXPECT_DOUBLE_EQ(llama_chunks, fresh);
  EXPECT_NE(llama_chunks, gpt_chunks);
}

}  // namespace
}  // namespace memwall
