// The Megatron-LM export against Megatron-LM's own argument parser and validate_args (read from
// NVIDIA/Megatron-LM at d98e8a64, core 0.20.0). Most flags are generated from config dataclass
// fields (megatron/training/argument_utils.py:106: "--" + field name with "-" for "_"), so a flag's
// source is its field: TC = megatron/core/transformer/transformer_config.py, MPC =
// megatron/core/model_parallel_config.py, TRC = megatron/training/config/training_config.py;
// args = megatron/training/arguments.py. The parser has allow_abbrev=False (args:119-120): every
// flag must be spelled in full. Every exported command of a grid of plans is held against those
// flags, their types and choices, and the rules validate_args and the config classes enforce.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "model/hardware_profile.hpp"
#include "model/placement.hpp"
#include "planner/megatron.hpp"
#include "planner/search.hpp"

namespace memwall::planner {
namespace {

enum class ArgKind { flag, integer, number, choice, int_tuple };  // int_tuple: tuple_type, "a,b" (args:377)
struct ArgSpec {
  ArgKind kind;
  std::set<std::string> choices = {};
};
const std::map<std::string, ArgSpec> kFlags = {
    {"--num-layers", {ArgKind::integer}},                    // TC:65
    {"--hidden-size", {ArgKind::integer}},                   // TC:145
    {"--ffn-hidden-size", {ArgKind::integer}},               // TC:180
    {"--num-attention-heads", {ArgKind::integer}},           // TC:148
    {"--seq-length", {ArgKind::integer}},                    // args:3305
    {"--max-position-embeddings", {ArgKind::integer}},       // args:2394
    {"--tensor-model-parallel-size", {ArgKind::integer}},    // MPC:55
    {"--pipeline-model-parallel-size", {ArgKind::integer}},  // MPC:83
    {"--micro-batch-size", {ArgKind::integer}},              // TRC:11
    {"--global-batch-size", {ArgKind::integer}},             // TRC:15
    {"--recompute-granularity", {ArgKind::choice, {"full", "selective"}}},  // TC:532
    {"--recompute-method", {ArgKind::choice, {"uniform", "block"}}},        // TC:543
    {"--recompute-num-layers", {ArgKind::integer}},          // TC:551
    {"--distribute-saved-activations", {ArgKind::flag}},     // TC:557
    {"--use-distributed-optimizer", {ArgKind::flag}},        // args:3156
    {"--optimizer-cpu-offload", {ArgKind::flag}},            // args:2918
    {"--optimizer-offload-fraction", {ArgKind::number}},     // args:2922
    {"--use-precision-aware-optimizer", {ArgKind::flag}},    // args:3667
    {"--bf16", {ArgKind::flag}},                             // MPC:180
    {"--fp16", {ArgKind::flag}},                             // MPC:177
    {"--tokenizer-type",
     {ArgKind::choice,
      {"BertWordPieceLowerCase", "BertWordPieceCase", "GPT2BPETokenizer", "SentencePieceTokenizer",
       "GPTSentencePieceTokenizer", "HuggingFaceTokenizer", "Llama2Tokenizer", "TikTokenizer", "MultimodalTokenizer",
       "NullTokenizer", "NullMultimodalTokenizer", "SFTTokenizer"}}},  // TRC:698
    {"--vocab-size", {ArgKind::integer}},                    // TRC:679
    {"--mock-data", {ArgKind::flag}},                        // args:3302
    {"--train-iters", {ArgKind::integer}},                   // TRC:64
    {"--lr", {ArgKind::number}},                             // args:2984
    {"--min-lr", {ArgKind::number}},                         // args:2991
    {"--lr-decay-style", {ArgKind::choice, {"constant", "linear", "cosine", "inverse-square-root", "WSD"}}},  // TRC:169
    {"--lr-warmup-iters", {ArgKind::integer}},               // TRC:190
    {"--weight-decay", {ArgKind::number}},                   // args:2611
    {"--clip-grad", {ArgKind::number}},                      // args:2615
    {"--log-interval", {ArgKind::integer}},                  // TRC:247
    {"--eval-iters", {ArgKind::integer}},                    // TRC:115
    // the model's kind (issue 27)
    {"--group-query-attention", {ArgKind::flag}},            // args:2382
    {"--num-query-groups", {ArgKind::integer}},              // TC:175
    {"--swiglu", {ArgKind::flag}},                           // args:2450
    {"--normalization", {ArgKind::choice, {"LayerNorm", "RMSNorm"}}},  // TC:256
    {"--position-embedding-type",
     {ArgKind::choice, {"learned_absolute", "rope", "yarn", "mrope", "relative", "none"}}},  // args:2397
    {"--untie-embeddings-and-output-weights", {ArgKind::flag}},  // args:2460
    {"--disable-bias-linear", {ArgKind::flag}},              // TC:212
    {"--add-qkv-bias", {ArgKind::flag}},                     // TC:218
    {"--num-experts", {ArgKind::integer}},                   // args:3518
    {"--moe-router-topk", {ArgKind::integer}},               // TC:760
    {"--moe-ffn-hidden-size", {ArgKind::integer}},           // TC:740
    {"--moe-shared-expert-intermediate-size", {ArgKind::integer}},  // TC:701
    {"--window-size", {ArgKind::int_tuple}},                 // args:2384, TC:247 (left, right)
    {"--kv-channels", {ArgKind::integer}},                   // TC:184 (default hidden / heads, args:1331)
};

// The flags as argparse would read them: name -> value ("" for store_true), or the problems.
std::map<std::string, std::string> parse_args(const std::vector<std::string>& args, std::vector<std::string>& bad) {
  std::map<std::string, std::string> got;
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& name = args[i];
    auto it = kFlags.find(name);
    if (it == kFlags.end()) {
      bad.push_back(name + ": not a flag of pretrain_gpt.py");
      continue;
    }
    if (got.count(name)) bad.push_back(name + ": given twice");
    if (it->second.kind == ArgKind::flag) {
      got[name] = "";
      continue;
    }
    if (i + 1 >= args.size() || args[i + 1].starts_with("--")) {
      bad.push_back(name + ": no value");
      continue;
    }
    const std::string& v = args[++i];
    char* end = nullptr;
    bool ok = true;
    switch (it->second.kind) {
      case ArgKind::integer: ok = std::strtol(v.c_str(), &end, 10) >= 0 && *end == 0; break;
      case ArgKind::number: ok = std::isfinite(std::strtod(v.c_str(), &end)) && *end == 0; break;
      case ArgKind::choice: ok = it->second.choices.count(v) > 0; break;
      case ArgKind::int_tuple: {  // int(i) for i in x.strip('()').split(',')
        std::stringstream in(v);
        std::string part;
        while (ok && std::getline(in, part, ',')) {
          std::strtol(part.c_str(), &end, 10);
          ok = !part.empty() && *end == 0;
        }
        break;
      }
      case ArgKind::flag: break;
    }
    if (!ok) bad.push_back(name + ": value \"" + v + "\" is not what Megatron-LM accepts");
    got[name] = v;
  }
  return got;
}

std::vector<std::string> check_command(const MegatronExport& e, const ModelSpec& m, const Candidate& c) {
  std::vector<std::string> bad;
  const auto a = parse_args(e.args, bad);
  auto n = [&](const char* k) { return a.count(k) ? std::atol(a.at(k).c_str()) : -1L; };
  auto has = [&](const char* k) { return a.count(k) > 0; };
  for (const char* required : {"--num-layers", "--hidden-size", "--num-attention-heads", "--max-position-embeddings",
                               "--micro-batch-size", "--seq-length"})  // args:693, 1314-1317
    if (!has(required)) bad.push_back(std::string(required) + ": missing");
  const long world = long(e.nodes) * e.gpus_per_node;
  const long tp = n("--tensor-model-parallel-size"), pp = n("--pipeline-model-parallel-size");
  if (world % (tp * pp) != 0) bad.push_back("world size not divisible by tp x pp (args:432)");
  const long dp = world / (tp * pp);
  if (dp != c.config.dp || tp != c.config.mp || pp != c.config.pp) bad.push_back("dp x tp x pp is not the plan's");
  const long mbs = n("--micro-batch-size"), gbs = n("--global-batch-size");
  if (gbs % (mbs * dp) != 0) bad.push_back("global batch not divisible by micro-batch x dp (args:715-720)");
  else if (gbs / (mbs * dp) != c.config.grad_accum) bad.push_back("micro-batches per step are not the plan's grad_accum");
  if (n("--num-layers") % pp != 0) bad.push_back("layers not divisible by pp (args:997-998)");
  if (n("--num-attention-heads") % tp != 0) bad.push_back("heads not divisible by tp (TC:1446-1450)");
  if (n("--hidden-size") % n("--num-attention-heads") != 0) bad.push_back("hidden not divisible by heads (args:1331)");
  if (n("--max-position-embeddings") < n("--seq-length")) bad.push_back("max positions below seq (args:1353-1356)");
  // the model Megatron-LM builds is the planned one
  if (n("--ffn-hidden-size") != m.ffn_size()) bad.push_back("ffn-hidden-size is not the model's");
  const long groups = has("--group-query-attention") ? n("--num-query-groups") : n("--num-attention-heads");
  if (groups != m.kv()) bad.push_back("query groups are not the model's KV heads");
  if (groups % tp != 0 && tp % groups != 0) bad.push_back("query groups neither a multiple nor a divisor of tp (TC:1460-1466)");
  if (has("--swiglu") != (m.ffn == FfnKind::swiglu)) bad.push_back("--swiglu is not the model's feed-forward");
  if ((a.count("--normalization") && a.at("--normalization") == "RMSNorm") != (m.norm == NormKind::rmsnorm))
    bad.push_back("normalization is not the model's");
  if ((a.count("--position-embedding-type") && a.at("--position-embedding-type") == "rope") !=
      (m.positions == PositionKind::rotary))
    bad.push_back("position embedding is not the model's");
  if (has("--untie-embeddings-and-output-weights") == m.tied_embeddings) bad.push_back("embedding tying is not the model's");
  // add_bias_linear keeps every bias, add_qkv_bias with it set (args:1608-1610)
  const bool all_bias = !has("--disable-bias-linear"), qkv_bias = all_bias || has("--add-qkv-bias");
  if (all_bias != (m.bias == BiasKind::all || m.bias == BiasKind::attention) || qkv_bias != (m.bias != BiasKind::none))
    bad.push_back("biases are not the model's");
  // an explicit head size is kv_channels; without it Megatron takes hidden / heads
  const long kv_channels = has("--kv-channels") ? n("--kv-channels") : n("--hidden-size") / n("--num-attention-heads");
  if (kv_channels != m.head_dim()) bad.push_back("kv-channels is not the model's head size");
  // a window of W keys per query is (W-1, 0): keys i - (W-1) .. i (Transformer Engine's convention)
  const bool windowed = m.attention_window > 0 && m.attention_window < m.seq;
  if (has("--window-size") != windowed) bad.push_back("sliding-window attention is not the model's");
  if (windowed && has("--window-size") && a.at("--window-size") != std::to_string(m.attention_window - 1) + ",0")
    bad.push_back("--window-size is not the model's window of " + std::to_string(m.attention_window) + " keys");
  if (has("--num-experts") != m.is_moe()) bad.push_back("experts are not the model's");
  if (m.is_moe() && (n("--num-experts") != m.moe.experts || n("--moe-router-topk") != m.moe.experts_per_token ||
                     n("--moe-ffn-hidden-size") != m.moe.expert_intermediate))
    bad.push_back("experts, top-k or expert size are not the model's");
  if (has("--bf16") == has("--fp16")) bad.push_back("exactly one of --bf16 and --fp16 (args:1195-1205)");
  if (has("--recompute-granularity") && a.at("--recompute-granularity") == "full") {  // TC:1908-1925
    if (!has("--recompute-method")) bad.push_back("full recompute without a method");
    const long r = n("--recompute-num-layers");
    if (r < 1 || r > n("--num-layers") / pp) bad.push_back("recompute-num-layers outside 1..layers per stage");
  }
  if (has("--distribute-saved-activations")) {  // args:1409-1417
    if (tp <= 1) bad.push_back("distribute-saved-activations with tp 1");
    if (!has("--recompute-granularity") || a.at("--recompute-granularity") != "full" || !has("--recompute-method"))
      bad.push_back("distribute-saved-activations without full recompute and a method");
  }
  if (has("--optimizer-cpu-offload") && !has("--use-precision-aware-optimizer"))
    bad.push_back("optimizer-cpu-offload without use-precision-aware-optimizer (args:1884-1888)");
  if (has("--use-precision-aware-optimizer") && !has("--use-distributed-optimizer"))
    bad.push_back("precision-aware optimizer without the distributed optimizer (optimizer/__init__.py:1057-1060)");
  if (has("--tokenizer-type") && a.at("--tokenizer-type") == "NullTokenizer" && !has("--vocab-size"))
    bad.push_back("NullTokenizer without --vocab-size (argument_utils.py:478)");
  if (n("--vocab-size") != m.vocab) bad.push_back("vocab is not the model's");
  bool needs_env = tp > 1, has_env = false;  // args:1453-1479
  for (const std::string& v : e.env) has_env = has_env || v == "CUDA_DEVICE_MAX_CONNECTIONS=1";
  if (needs_env && !has_env) bad.push_back("tp > 1 without CUDA_DEVICE_MAX_CONNECTIONS=1");
  return bad;
}

TEST(Megatron, EveryExportedFlagIsOneMegatronParses) {
  const HardwareProfile p = *load_profile("dgx2");
  int exported = 0, refused = 0;
  for (const char* model : {"table1-10B", "table4-13B", "table1-50B", "llama3-8B", "qwen2-72B", "mixtral-8x7B", "mistral-7B",
                            "llama3-8B head 64"}) {
    ModelSpec m = *load_model(std::string(model).substr(0, std::string(model).find(' ')));
    if (std::string(model).ends_with("head 64")) m.head_size = 64;  // an explicit head size: --kv-channels 64
    for (const std::string& name : preset_names()) {
      const Placement pl = *preset(name);
      for (int mp : {1, 2, 4})
        for (int pp : {1, 2, 5}) {
          Candidate c;
          c.placement = pl;
          c.config.mp = mp;
          c.config.pp = pp;
          c.config.dp = 16 / mp / (pp == 5 ? 1 : pp);
          c.config.bsz = 2;
          c.config.grad_accum = pp > 1 ? 4 * pp : 1;
          c.config.ci = 2;
          Result<MegatronExport> e = megatron_export(m, c, p, mp == 2 ? "bf16" : "fp16");
          if (!megatron_cannot(pl).empty() || m.layers % pp != 0 || m.heads % mp != 0) {
            EXPECT_FALSE(e.ok()) << model << " " << name << " mp " << mp << " pp " << pp;
            ++refused;
            continue;
          }
          ASSERT_TRUE(e.ok()) << e.error();
          for (const std::string& b : check_command(*e, m, c))
            ADD_FAILURE() << model << " " << name << " mp " << mp << " pp " << pp << ": " << b;
          ++exported;
        }
    }
  }
  EXPECT_GT(exported, 30);
  EXPECT_GT(refused, 30);
}

// A three_d plan (tensor slicing, pipeline stages, accumulation) planned for Megatron-LM: the
// command carries its sizes and batch arithmetic, partitioned checkpoints become
// --distribute-saved-activations, and what Megatron-LM does differently is in the notes.
TEST(Megatron, ThreeDPlanForMegatron) {
  const ModelSpec m = *load_model("table1-10B");
  const HardwareProfile p = *load_profile("dgx2");
  Fixes fx;
  fx.strategy = "three_d";
  SearchSpace space = *make_space(m, p, fx);
  Result<SearchSpace> mg = megatron_space(space, m);
  ASSERT_TRUE(mg.ok()) << mg.error();
  for (int pp : mg->pp) EXPECT_EQ(m.layers % pp, 0);
  SearchResult r = search(m, p, *mg);
  ASSERT_TRUE(r.fits());
  const Candidate& c = r.ranked.front().candidate;
  Result<MegatronExport> e = megatron_export(m, c, p, "fp16");
  ASSERT_TRUE(e.ok()) << e.error();
  EXPECT_TRUE(check_command(*e, m, c).empty());
  const std::string script = e->script();
  EXPECT_NE(script.find("torchrun --nnodes 1 --nproc-per-node 16 pretrain_gpt.py"), std::string::npos) << script;
  EXPECT_NE(script.find("--tensor-model-parallel-size " + std::to_string(c.config.mp)), std::string::npos);
  EXPECT_NE(e->notes().find("pads 50257 to"), std::string::npos) << e->notes();
  EXPECT_NE(script.find("--clip-grad 1.0 "), std::string::npos) << script;  // Megatron's default: the plan has none
  Candidate clipped = c;
  clipped.config.grad_clip = 0.7;  // the plan's own
  EXPECT_NE(megatron_export(m, clipped, p, "fp16")->script().find("--clip-grad 0.7 "), std::string::npos);
  Candidate partitioned = c;
  partitioned.placement.act_ckpt.partitioned = true;
  partitioned.config.mp = 4;
  partitioned.config.dp = 16 / 4 / c.config.pp;
  e = megatron_export(m, partitioned, p, "bf16");
  ASSERT_TRUE(e.ok()) << e.error();
  EXPECT_NE(e->script().find("--distribute-saved-activations"), std::string::npos);
  // ZeRO-3 and NVMe are refused with the reason, not exported as something else
  Candidate z3 = c;
  z3.placement = *preset("zero3");
  EXPECT_NE(megatron_export(m, z3, p, "fp16").error().find("Megatron-FSDP"), std::string::npos);
  z3.placement = *preset("zero_inf_nvme");
  EXPECT_FALSE(megatron_export(m, z3, p, "fp16").ok());
  // CPU optimizer offload: the distributed, precision-aware optimizer Megatron-LM needs for it
  Candidate off = c;
  off.placement = *preset("zero_offload");
  e = megatron_export(m, off, p, "bf16");
  ASSERT_TRUE(e.ok()) << e.error();
  EXPECT_TRUE(check_command(*e, m, off).empty());
  EXPECT_NE(e->script().find("--optimizer-cpu-offload"), std::string::npos);
  EXPECT_NE(e->notes().find("gradient buffer stays on the GPU"), std::string::npos) << e->notes();
}

}  // namespace
}  // namespace memwall::planner
