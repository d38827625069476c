// gpt_ref_tool OUT_DIR CI [BACKEND [STRATEGY [OVERLAP [DPU_WARMUP [STEPS]]]]] [--kind=K] [--tiling=N] [--clip=X]:
// trains a tiny GPT for 10 steps (or STEPS) with exec/engine, its CPU optimizer run as OVERLAP says
// (none, backward, dpu), in fp32 (default strategy zero_inf_nvme, swap files in OUT_DIR/swap) and
// writes what torch_reference.py compares against PyTorch: meta.json (config, parameter layout, the
// loss of batch 0 and the losses of the 10 AdamW steps), params.bin (initial fp32 parameters),
// tokens.bin / targets.bin (int32 (steps, B, T)), logits.bin ((B, T, V) of batch 0) and grads.bin
// (the gradients of batch 0, as the optimizer read them). CI 0 means one checkpoint for the whole
// stack. K is the block's kind: gpt (the paper's, default), llama (RMSNorm, rotary attention with 2
// key/value heads for 4 query heads, SwiGLU, untied LM head, no biases) or mixed (MQA with a head
// size of 12 (not 32/4), GeGLU, LayerNorm, rotary, tied, biases on qkv only: the remaining combinations).
// X: gradient clipping at global norm X (meta.json then has each step's norm, grad_norms).
// --mp=N, under mpirun -np N: the model in N tensor slices (Megatron's); each rank writes its
// slice's initial parameters and batch-0 gradients (params.rankR.bin, grads.rankR.bin) and where
// each of their elements sits in the whole parameter array (index.rankR.bin, uint64:
// gpt_slice_indices), rank 0 the rest; meta.json says mp.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec/engine/collectives.hpp"
#include "exec/engine/engine.hpp"
#include "exec/gpt/gpt.hpp"
#include "tests/exec/device_skip.hpp"

using namespace memwall;
using namespace memwall::exec;

namespace {
template <typename T>
void write_bin(const std::string& path, const std::vector<T>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(T)));
}
}  // namespace

int main(int argc_in, char** argv_in) {
  std::vector<char*> args;  // the positional arguments; --kind= and --tiling= taken out
  std::string kind = "gpt";
  int tiling = 1;
  double clip = 0;
  int mp = 1;
  for (int i = 0; i < argc_in; ++i) {
    const std::string a = argv_in[i];
    if (a.starts_with("--kind=")) kind = a.substr(7);
    else if (a.starts_with("--mp=")) mp = std::stoi(a.substr(5));
    else if (a.starts_with("--clip=")) clip = std::stod(a.substr(7));
    else if (a.starts_with("--tiling=")) tiling = std::stoi(a.substr(9));
    else args.push_back(argv_in[i]);
  }
  const int argc = int(args.size());
  char** argv = args.data();
  if (argc < 3) {
    std::cerr << "usage: gpt_ref_tool OUT_DIR CI [cpu|cuda [STRATEGY [OVERLAP [DPU_WARMUP [STEPS]]]]] [--kind=gpt|llama|mixed]"
                 " [--tiling=N]\n";
    return 2;
  }
  const std::string dir = argv[1];
  EngineOptions o;
  o.model = GptConfig{3, 32, 4, 16, 256};  // L, C, NH, maxT, V
  if (kind == "llama") {
    o.model.kv_heads = 2;
    o.model.ffn = FfnKind::swiglu;
    o.model.intermediate = 48;
    o.model.norm = NormKind::rmsnorm;
    o.model.positions = PositionKind::rotary;
    o.model.tied_embeddings = false;
    o.model.bias = BiasKind::none;
    o.model.rope_theta = 500000;
  } else if (kind == "mixed") {
    o.model.kv_heads = 1;
    o.model.head_size = 12;  // an explicit head size: q is 4 x 12 = 48 channels on a 32-channel model
    o.model.ffn = FfnKind::geglu;
    o.model.intermediate = 40;
    o.model.positions = PositionKind::rotary;
    o.model.bias = BiasKind::qkv;
  } else if (kind != "gpt") {
    std::cerr << "gpt_ref_tool: --kind: expected gpt, llama or mixed, got " << kind << "\n";
    return 2;
  }
  o.config.tiling_factor = tiling;
  o.config.grad_clip = clip;
  o.config.mp = mp;
const int ci = std::stoi(argv[2]);
  o.config.bsz = 3;
  o.config.ci = ci == 0 ? o.model.layers : ci;
  o.backend = argc > 3 ? argv[3] : "cpu";
  o.placement = preset(argc > 4 ? argv[4] : "zero_inf_nvme").value();
  o.profile = load_profile("local-cpu").value();
  o.precision = adam::DType::fp32;
  o.lr = 1e-2;
  o.seed = 7;
  o.keep_gradients = true;
  if (argc > 5) o.config.optimizer_overlap = parse_optimizer_overlap(argv[5]).value();
  if (argc > 6) o.config.dpu_warmup = std::stoi(argv[6]);
  o.nvme_dir = dir + "/swap";
  std::filesystem::create_directories(o.nvme_dir);
  const int steps = argc > 7 ? std::stoi(argv[7]) : 10;
  auto engine = Engine::create(o);
  if (!engine) {
    std::cerr << "gpt_ref_tool: " << engine.error() << "\n";
    // 77: ctest's skip, only for an absent device and never with MEMWALL_REQUIRE_CUDA=1
    return memwall::test::may_skip_for_device(engine.error()) ? 77 : 1;
  }
  Engine& e = **engine;
  const std::size_t BT = std::size_t(o.config.bsz) * std::size_t(o.model.max_seq), V = 256;

  // random bytes from a 16-letter alphabet, each followed by a fixed function of itself: learnable
  // in a few steps, so the 10 steps' losses fall (every row of the tied embedding still gets a
  // gradient, through the LM head)
  std::vector<int> tokens(steps * BT), targets(steps * BT);
  std::uint64_t s = 12345;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    tokens[i] = int((s >> 33) % 16);
    targets[i] = (tokens[i] * 7 + 3) % 16;
  }
  const std::vector<float> params0 = e.master_params().value();
  std::vector<float> losses, logits, grads;
  std::vector<double> norms;
  for (int i = 0; i < steps; ++i) {
    std::vector<int> tk(tokens.begin() + long(i * BT), tokens.begin() + long((i + 1) * BT));
    std::vector<int> tg(targets.begin() + long(i * BT), targets.begin() + long((i + 1) * BT));
    auto r = e.step(tk, tg);
    if (!r) {
      std::cerr << "gpt_ref_tool: " << r.error() << "\n";
      return 1;
    }
    losses.push_back(r->loss);
    norms.push_back(r->grad_norm);
if (i == 0) {  // batch 0 by the engine: its logits, and the gradients CPU Adam consumed
      logits = e.logits().value();
      // the engine's gradients are in partition (tile-major) order; untiled here, so it is the
      // parameter array's order
      grads = e.gradients().value();
    }
  }

  nlohmann::ordered_json meta;
  meta["layers"] = o.model.layers;
  meta["hidden"] = o.model.hidden;
  meta["heads"] = o.model.heads;
  meta["max_seq"] = o.model.max_seq;
  meta["vocab"] = o.model.vocab;
  meta["kind"] = kind;
  meta["kv_heads"] = o.model.kv();
  meta["head_dim"] = o.model.head_dim();
  meta["ffn"] = to_string(o.model.ffn);
  meta["intermediate"] = o.model.ffn_size();
  meta["norm"] = to_string(o.model.norm);
  meta["positions"] = to_string(o.model.positions);
  meta["tied_embeddings"] = o.model.tied_embeddings;
  meta["rope_theta"] = o.model.rope_theta;
  meta["tiling"] = tiling;
  meta["B"] = int(o.config.bsz);
  meta["T"] = o.model.max_seq;
  meta["ci"] = ci;
  meta["lr"] = o.lr;
  meta["steps"] = steps;
  meta["strategy"] = o.placement.name;
  meta["overlap"] = to_string(o.config.optimizer_overlap);
  meta["dpu_warmup"] = o.config.dpu_warmup;
  meta["loss"] = losses.front();
  meta["losses"] = losses;
  meta["grad_clip"] = clip;
  meta["mp"] = mp;
  if (clip > 0) meta["grad_norms"] = norms;
meta["tensors"] = nlohmann::json::array();
  for (const ParamTensor& p : gpt_param_tensors(o.model))
    meta["tensors"].push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}, {"elems", p.elems}});
  if (mp > 1) {  // this slice's part, and where it sits in the whole model
    const int r = MpiWorld::get().rank();
    const std::string tag = ".rank" + std::to_string(r) + ".bin";
    const std::vector<std::size_t> at = gpt_slice_indices(mp_slice(o.model, mp, r));
    write_bin(dir + "/params" + tag, params0);
    write_bin(dir + "/grads" + tag, grads);
    write_bin(dir + "/index" + tag, std::vector<std::uint64_t>(at.begin(), at.end()));
    if (r != 0) return 0;
  } else {
    write_bin(dir + "/params.bin", params0);
    write_bin(dir + "/grads.bin", grads);
  }
  std::ofstream(dir + "/meta.json") << meta.dump(1) << "\n";
  write_bin(dir + "/tokens.bin", tokens);
  write_bin(dir + "/targets.bin", targets);
  write_bin(dir + "/logits.bin", logits);
  (void)V;
  return 0;
}
