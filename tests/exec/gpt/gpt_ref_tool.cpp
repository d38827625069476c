// gpt_ref_tool OUT_DIR CI [BACKEND]: runs a tiny GPT on memwall's backend and writes what
// torch_reference.py compares against PyTorch: meta.json (config, parameter layout, loss, the
// losses of 10 Adam steps), params.bin (initial fp32 parameters), tokens.bin / targets.bin
// (int32 (steps, B, T)), logits.bin ((B, T, V) of batch 0) and grads.bin (of batch 0).
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "exec/gpt/train.hpp"

using namespace memwall::exec;

namespace {
template <typename T>
void write_bin(const std::string& path, const std::vector<T>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), std::streamsize(v.size() * sizeof(T)));
}
}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: gpt_ref_tool OUT_DIR CI [cpu|cuda]\n";
    return 2;
  }
  const std::string dir = argv[1];
  RunConfig cfg;
  cfg.model = GptConfig{3, 32, 4, 16, 256};  // L, C, NH, maxT, V
  cfg.bsz = 3;
  cfg.seq = 16;
  cfg.ci = std::stoi(argv[2]);
  cfg.lr = 1e-2;
  cfg.seed = 7;
  cfg.backend = argc > 3 ? argv[3] : "cpu";
  const int steps = 10;
  auto trainer = Trainer::create(cfg);
  if (!trainer) {
    std::cerr << "gpt_ref_tool: " << trainer.error() << "\n";
    return trainer.error().rfind("backend: no CUDA device", 0) == 0 ? 77 : 1;  // 77: ctest's skip
  }
  Trainer& t = **trainer;
  Gpt& g = t.model();
  Backend& be = t.backend();
  const std::size_t BT = std::size_t(cfg.bsz) * cfg.seq, V = 256;

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
  const std::vector<float> params0 = t.master_params();

  // batch 0 by hand: logits, loss and gradients
  be.ops().copy_h2d_async(be.ctx(), 0, g.tokens(), tokens.data(), BT * sizeof(int));
  be.ops().copy_h2d_async(be.ctx(), 0, g.targets(), targets.data(), BT * sizeof(int));
  be.ops().synchronize(be.ctx());
  g.zero_grad();
  g.forward();
  std::vector<float> logits(BT * V), grads(g.num_params());
  be.ops().copy_d2h_async(be.ctx(), 0, logits.data(), g.logits(), logits.size() * sizeof(float));
  const float loss = g.loss();
  g.backward();
  be.ops().copy_d2h_async(be.ctx(), 0, grads.data(), g.grads(), grads.size() * sizeof(float));
  be.ops().synchronize(be.ctx());

  std::vector<float> losses;
  for (int i = 0; i < steps; ++i) {
    std::vector<int> tk(tokens.begin() + long(i * BT), tokens.begin() + long((i + 1) * BT));
    std::vector<int> tg(targets.begin() + long(i * BT), targets.begin() + long((i + 1) * BT));
    auto l = t.step(tk, tg);
    if (!l) {
      std::cerr << "gpt_ref_tool: " << l.error() << "\n";
      return 1;
    }
    losses.push_back(*l);
  }

  nlohmann::ordered_json meta;
  meta["layers"] = cfg.model.layers;
  meta["hidden"] = cfg.model.hidden;
  meta["heads"] = cfg.model.heads;
  meta["max_seq"] = cfg.model.max_seq;
  meta["vocab"] = cfg.model.vocab;
  meta["B"] = cfg.bsz;
  meta["T"] = cfg.seq;
  meta["ci"] = cfg.ci;
  meta["lr"] = cfg.lr;
  meta["steps"] = steps;
  meta["loss"] = loss;
  meta["losses"] = losses;
  meta["tensors"] = nlohmann::json::array();
  for (const ParamTensor& p : g.tensors())
    meta["tensors"].push_back({{"name", p.name}, {"shape", p.shape}, {"offset", p.offset}, {"elems", p.elems}});
  meta["groups"] = nlohmann::json::array();
  for (const ParamGroup& p : g.groups())
    meta["groups"].push_back({{"name", p.name}, {"offset", p.offset}, {"elems", p.elems}});
  std::ofstream(dir + "/meta.json") << meta.dump(1) << "\n";
  write_bin(dir + "/params.bin", params0);
  write_bin(dir + "/tokens.bin", tokens);
  write_bin(dir + "/targets.bin", targets);
  write_bin(dir + "/logits.bin", logits);
  write_bin(dir + "/grads.bin", grads);
  return 0;
}
