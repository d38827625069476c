#include "planner/megatron.hpp"

#include <cmath>

#include "model/analysis.hpp"
#include "model/units.hpp"

namespace memwall::planner {
namespace {

// Megatron-LM pads the vocabulary to a multiple of make-vocab-size-divisible-by (128) x tp
// (megatron/core/tokenizers/utils/build_tokenizer.py:133-146).
long padded_vocab(long vocab, int tp) {
  const long step = 128L * tp;
  return (vocab + step - 1) / step * step;
}

std::string join_lines(const std::vector<std::string>& items) {
  std::string out;
  if (items.empty()) out += "  none\n";
  for (const std::string& s : items) out += "  - " + s + "\n";
  return out;
}

}  // namespace

std::string megatron_cannot(const Placement& pl) {
  if (pl.layer_major) return "l2l's layer-major schedule is not a Megatron-LM schedule";
  if (pl.param16.tier != Tier::gpu)
    return "parameters offloaded to " + std::string(to_string(pl.param16.tier)) +
           ": Megatron-LM keeps every parameter of its slice in GPU memory";
  if (pl.param16.partitioned)
    return "parameters partitioned over the data-parallel ranks (ZeRO-3): Megatron-LM runs that only as "
           "Megatron-FSDP, which this export does not write";
  if (pl.grad16.tier == Tier::nvme || pl.optim32.tier == Tier::nvme)
    return "states on NVMe: Megatron-LM offloads the optimizer to CPU memory only";
  return "";
}

Result<SearchSpace> megatron_space(SearchSpace space, const ModelSpec& m) {
  Result<SearchSpace> narrowed = narrow_placements(std::move(space), megatron_cannot, "--for megatron");
  if (!narrowed) return narrowed;
  SearchSpace s = std::move(narrowed).value();
  s.overlaps = {OptimizerOverlap::none};
  std::vector<int> pp;  // args.py:997-998: the layers split evenly over the stages
  for (int p : s.pp)
    if (m.layers % p == 0) pp.push_back(p);
  s.pp = pp.empty() ? std::vector<int>{1} : pp;
  std::vector<int> v;  // interleaved: --num-layers-per-virtual-pipeline-stage layers in every chunk
  for (int x : s.virtual_stages)
    if (std::all_of(s.pp.begin(), s.pp.end(), [&](int p) { return p == 1 || m.layers % (p * x) == 0; })) v.push_back(x);
  s.virtual_stages = v.empty() ? std::vector<int>{1} : v;
  std::vector<int> mp;  // transformer_config.py:1446-1450: heads split evenly over the slices
  for (int t : s.mp)
    if (m.heads % t == 0) mp.push_back(t);
  if (mp.empty()) return make_error("--for megatron: no tensor-slicing degree divides the " + std::to_string(m.heads) + " heads");
  s.mp = mp;
  return s;
}

Result<MegatronExport> megatron_export(const ModelSpec& m, const Candidate& c, const HardwareProfile& p,
                                       const std::string& precision) {
  const TrainingConfig& k = c.config;
  const Placement& pl = c.placement;
  if (const std::string why = megatron_cannot(pl); !why.empty()) return make_error("--megatron: " + why);
  if (k.bsz != std::floor(k.bsz))
    return make_error("--megatron: --micro-batch-size must be an integer, the plan has bsz " + format_g(k.bsz));
  if (m.heads % k.mp != 0)
    return make_error("--megatron: " + std::to_string(m.heads) + " heads do not split over tensor-parallel size " +
                      std::to_string(k.mp) + " (Megatron-LM needs heads divisible by it)");
  if (m.layers % k.pp != 0)
    return make_error("--megatron: " + std::to_string(m.layers) + " layers do not split evenly over " +
                      std::to_string(k.pp) + " pipeline stages (Megatron-LM needs num-layers divisible by them)");
  const int chunks = k.pp > 1 ? std::max(1, k.virtual_stages) : 1;
  if (m.layers % (k.pp * chunks) != 0)
    return make_error("--megatron: " + std::to_string(m.layers) + " layers do not split evenly over " +
                      std::to_string(k.pp) + " x " + std::to_string(chunks) +
                      " virtual pipeline stages (Megatron-LM needs num-layers divisible by them)");
  const int stage_layers = m.layers / k.pp / chunks;
  if (k.ci > stage_layers)
    return make_error("--megatron: the checkpoint interval " + std::to_string(k.ci) + " is above a " +
                      std::string(chunks > 1 ? "virtual stage's " : "stage's ") + std::to_string(stage_layers) + " layers (--recompute-num-layers must be at most that)");
  if (precision != "bf16" && precision != "fp16")
    return make_error("--precision: expected bf16 or fp16, got \"" + precision + "\"");
  MegatronExport out;
  const long world = long(k.dp) * k.mp * k.pp;
  out.gpus_per_node = int(std::min<long>(world, p.gpus_per_node));
  out.nodes = int((world + out.gpus_per_node - 1) / out.gpus_per_node);
  const long micro = long(k.bsz);
  auto flag = [&](const std::string& name, const std::string& value = "") {
    out.args.push_back(name);
    if (!value.empty()) out.args.push_back(value);
  };
  auto num = [](long v) { return std::to_string(v); };
  flag("--num-layers", num(m.layers));
  flag("--hidden-size", num(m.hidden));
  flag("--ffn-hidden-size", num(m.ffn_size()));  // the paper's GPT: a 4 x hidden GeLU feed-forward
  flag("--num-attention-heads", num(m.heads));
  flag("--seq-length", num(m.seq));
  flag("--max-position-embeddings", num(m.seq));
  // the model's kind, as Megatron-LM's arguments name it
  if (m.attention_width() != m.hidden) flag("--kv-channels", num(m.head_dim()));  // TransformerConfig.kv_channels
  if (m.kv() != m.heads) {
    flag("--group-query-attention");
    flag("--num-query-groups", num(m.kv()));
  }
  if (m.ffn == FfnKind::swiglu) flag("--swiglu");
  if (m.norm == NormKind::rmsnorm) flag("--normalization", "RMSNorm");
  if (m.positions == PositionKind::rotary) flag("--position-embedding-type", "rope");
  if (!m.tied_embeddings) flag("--untie-embeddings-and-output-weights");
  if (m.bias == BiasKind::none || m.bias == BiasKind::qkv) flag("--disable-bias-linear");
  if (m.bias == BiasKind::qkv) flag("--add-qkv-bias");
  // sliding-window attention: TransformerConfig.window_size (left, right), Transformer Engine's
  // convention that query i attends to keys i - left .. i + right; W keys per query, causal: (W-1, 0)
  if (m.attention_window > 0 && m.attention_window < m.seq) flag("--window-size", num(m.attention_window - 1) + ",0");
  if (m.is_moe()) {
    flag("--num-experts", num(m.moe.experts));
    flag("--moe-router-topk", num(m.moe.experts_per_token));
    flag("--moe-ffn-hidden-size", num(m.moe.expert_intermediate));
    if (m.moe.shared_experts > 0)
      flag("--moe-shared-expert-intermediate-size", num(long(m.moe.shared_experts) * m.moe.expert_intermediate));
  }
  flag("--tensor-model-parallel-size", num(k.mp));
  flag("--pipeline-model-parallel-size", num(k.pp));
  if (chunks > 1) flag("--num-layers-per-virtual-pipeline-stage", num(m.layers / k.pp / chunks));
  flag("--micro-batch-size", num(micro));
  flag("--global-batch-size", num(micro * k.grad_accum * k.dp));
  // memwall's checkpoint interval: the input of every ci blocks kept, the blocks recomputed
  // (recompute.py:157-181: uniform chunks of recompute-num-layers on each pipeline rank)
  flag("--recompute-granularity", "full");
  flag("--recompute-method", "uniform");
  flag("--recompute-num-layers", num(k.ci));
  if (pl.act_ckpt.partitioned && k.mp > 1) flag("--distribute-saved-activations");  // each slice keeps 1/mp
  const bool optimizer_offload = pl.optim32.tier == Tier::cpu;
  if (pl.optim32.partitioned || optimizer_offload) flag("--use-distributed-optimizer");
  if (optimizer_offload) {
    flag("--optimizer-cpu-offload");
    flag("--optimizer-offload-fraction", "1.0");
    flag("--use-precision-aware-optimizer");  // args.py:1884-1888: the CPU offload needs it
  }
  flag(precision == "bf16" ? "--bf16" : "--fp16");
  flag("--tokenizer-type", "NullTokenizer");
  flag("--vocab-size", num(m.vocab));
  flag("--mock-data");
  flag("--train-iters", "1000");
  flag("--lr", "1e-4");
  flag("--min-lr", "1e-5");
  flag("--lr-decay-style", "cosine");
  flag("--lr-warmup-iters", "100");
  flag("--weight-decay", "0.1");
  flag("--clip-grad", k.grad_clip > 0 ? format_g(k.grad_clip) : "1.0");  // the plan's, else Megatron's default
  flag("--log-interval", "1");
  flag("--eval-iters", "0");
  // args.py:1453-1479: tensor (or context) parallelism on Hopper and older needs one connection
  if (k.mp > 1) out.env.push_back("CUDA_DEVICE_MAX_CONNECTIONS=1");

  // What Megatron-LM does differently from the plan.
  if (m.ffn == FfnKind::geglu)
    out.differences.push_back("feed-forward: the model's GeGLU has no Megatron-LM argument (--swiglu is SiLU-gated): "
                              "the command trains an ungated GeLU feed-forward of the same size (a third fewer "
                              "feed-forward parameters than planned); set gated_linear_unit with a GeLU in your model code");
  if (m.bias == BiasKind::attention)
    out.differences.push_back("biases: the model has them in attention only; Megatron-LM's --disable-bias-linear "
                              "removes all or none, so the command keeps them everywhere (the MLP's too)");
  if (m.attention_window > 0)
    out.differences.push_back("attention: the plan's sliding window of " + num(m.attention_window) +
                              " keys is not exported; Megatron-LM attends over the whole sequence (more attention FLOPs "
                              "and score memory than planned)");
  if (m.is_moe())
    out.differences.push_back("experts: the plan partitions every expert's parameters over the data-parallel ranks "
                              "like the rest; Megatron-LM keeps them whole per rank unless --expert-model-parallel-size "
                              "splits the experts (memwall does not plan expert parallelism yet)");
  if (pl.grad16.partitioned)
    out.differences.push_back("gradients: the plan partitions them over the " + std::to_string(k.dp) +
                              " data-parallel ranks; Megatron-LM keeps a whole gradient buffer per rank (its "
                              "distributed optimizer reduce-scatters it), so each GPU holds " +
                              format_bytes(2.0 * model_param_count(m) / k.mp / k.pp * (1 - 1.0 / k.dp)) +
                              " more than planned");
  if (pl.grad16.tier == Tier::cpu)
    out.differences.push_back("gradients: the plan keeps them in CPU memory; Megatron-LM's gradient buffer stays on "
                              "the GPU and is copied to CPU memory for the optimizer step");
  if (optimizer_offload && !pl.optim32.partitioned)
    out.differences.push_back("optimizer states: Megatron-LM's CPU offload runs only in the distributed optimizer, so "
                              "the states are partitioned over the data-parallel ranks (the plan keeps them whole)");
  if (pl.act_ckpt.tier != Tier::gpu)
    out.differences.push_back("activation checkpoints: the plan keeps them in " + std::string(to_string(pl.act_ckpt.tier)) +
                              " memory; Megatron-LM cannot offload activations while recomputing "
                              "(transformer_config.py:1896-1899), so they stay in GPU memory");
  if (pl.act_ckpt.partitioned && k.mp == 1)
    out.differences.push_back("activation checkpoints: partitioned in the plan, whole in Megatron-LM (tp 1)");
  if (k.optimizer_overlap != OptimizerOverlap::none)
    out.differences.push_back("optimizer: the plan overlaps CPU Adam with " +
                              std::string(k.optimizer_overlap == OptimizerOverlap::dpu ? "the next step (dpu)" : "backward") +
                              "; Megatron-LM steps the optimizer after backward: plan with --for megatron for its timing");
  if (k.tiling_factor > 1)
    out.differences.push_back("memory-centric tiling " + std::to_string(k.tiling_factor) +
                              ": Megatron-LM has none; its linear layers run whole (more working memory)");
  if (const long padded = padded_vocab(m.vocab, k.mp); padded != m.vocab)
    out.differences.push_back("vocabulary: Megatron-LM pads " + std::to_string(m.vocab) + " to " + std::to_string(padded) +
                              " rows (a multiple of 128 x tp), " + format_count(double(padded - m.vocab) * m.hidden) +
                              " more embedding parameters");
  out.user_changes.push_back("data: --mock-data and NullTokenizer train on synthetic tokens; give --data-path and your "
                             "tokenizer (--tokenizer-type, its files) instead");
  out.user_changes.push_back("--train-iters, --lr, --min-lr, --lr-warmup-iters and --weight-decay are placeholders: set "
                             "yours (or pass them after the script's name: later flags win)");
  if (out.nodes > 1)
    out.user_changes.push_back("several nodes: run the script on each of the " + std::to_string(out.nodes) +
                               " nodes with torchrun's --node-rank, --master-addr and --master-port (or a launcher "
                               "such as srun that sets them)");
  return out;
}

std::string MegatronExport::script() const {
  std::string s = "#!/bin/sh\n# Megatron-LM (core 0.20) command for a memwall plan: run it from a Megatron-LM checkout.\n"
                  "# Flags given to this script are appended (argparse: the last value of a flag wins).\n"
                  "set -e\n";
  for (const std::string& e : env) s += "export " + e + "\n";
  s += "exec torchrun --nnodes " + std::to_string(nodes) + " --nproc-per-node " + std::to_string(gpus_per_node) +
       " pretrain_gpt.py";
  for (std::size_t i = 0; i < args.size(); ++i) {
    const bool name = args[i].starts_with("--");
    s += name ? " \\\n  " + args[i] : " " + args[i];
  }
  return s + " \\\n  \"$@\"\n";
}

std::string MegatronExport::notes() const {
  return "Megatron-LM command exported by memwall plan: " + std::to_string(nodes) + " node(s) x " +
         std::to_string(gpus_per_node) + " GPUs\n\nDifferences from the plan (Megatron-LM runs it differently):\n" +
         join_lines(differences) + "\nWhat you must supply or set:\n" + join_lines(user_changes);
}

}  // namespace memwall::planner
