// exec/gpt: the operators against the operator graph (names, parameter groups), the tile-major
// layout, memory-centric tiling (a linear operator run tile by tile equals the untiled one) and the
// workspace. Training through these operators is tested in tests/exec/engine; the numerical
// comparison with PyTorch is torch_reference.py (ctest gpt.torch_reference).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "exec/gpt/gpt.hpp"
#include "model/analysis.hpp"
#include "model/model_spec.hpp"
#include "model/operator_graph.hpp"

using namespace memwall;
using namespace memwall::exec;

namespace {


std::vector<float> randn(std::size_t n, unsigned seed, float scale = 0.5f) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = u(g);
  return v;
}

double rel(const std::vector<float>& x, const std::vector<float>& r) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    num = std::max(num, std::abs(double(x[i]) - double(r[i])));
    den = std::max(den, std::abs(double(r[i])));
  }
  return num / std::max(den, 1e-30);
}

// A backend, a workspace and the operators, plus host <-> device helpers.
struct Rig {
  GptConfig cfg;
  int B, T, tiles;
  std::unique_ptr<Backend> be;
  void* ws = nullptr;
  std::unique_ptr<GptOps> ops;
  std::vector<void*> held;

  Rig(GptConfig c, int b, int t, int ci, int tl) : cfg(c), B(b), T(t), tiles(tl) {
    be = create_backend("cpu").value();
    const std::size_t bytes = GptOps::workspace_bytes(cfg, B, T, ci, 1, tiles);
    ws = be->ops().alloc(be->ctx(), bytes + 256).value();
    void* aligned = reinterpret_cast<void*>((reinterpret_cast<std::uintptr_t>(ws) + 255) / 256 * 256);
    ops = GptOps::create(*be, cfg, B, T, ci, 1, tiles, aligned, bytes).value();
  }
  ~Rig() {
    ops.reset();
    for (void* p : held) be->ops().free(be->ctx(), p);
    be->ops().free(be->ctx(), ws);
  }
  float* up(const std::vector<float>& h) {
    float* d = alloc_array<float>(*be, h.size()).value();
    held.push_back(d);
    be->ops().copy_h2d_async(be->ctx(), 0, d, h.data(), h.size() * 4);
    return d;
  }
  std::vector<float> down(const float* d, std::size_t n) {
    std::vector<float> h(n);
    be->ops().copy_d2h_async(be->ctx(), 0, h.data(), d, n * 4);
    be->ops().synchronize(be->ctx());
    return h;
  }
};

}  // namespace

// The paper's GPT, the Llama block (GQA, SwiGLU, RMSNorm, rotary, untied, no biases) and the other
// dense kinds (MQA with a head size 1.5 x hidden/heads, GeGLU, LayerNorm with rotary, qkv biases) at
// a given size.
std::vector<GptConfig> kinds(GptConfig g) {
  GptConfig llama = g, mixed = g;
  llama.kv_heads = g.heads / 2, llama.ffn = FfnKind::swiglu, llama.intermediate = 3 * g.hidden;
  llama.norm = NormKind::rmsnorm, llama.positions = PositionKind::rotary, llama.tied_embeddings = false;
  llama.bias = BiasKind::none;
  mixed.kv_heads = 1, mixed.head_size = 3 * g.hidden / g.heads / 2, mixed.ffn = FfnKind::geglu;
  mixed.intermediate = 2 * g.hidden;
  mixed.positions = PositionKind::rotary, mixed.bias = BiasKind::qkv;
  return {g, llama, mixed};
}
std::string kind_of(const GptConfig& g) {
  const std::string k = gpt_model_spec(g).kind_words();
  return k.empty() ? "GPT" : k;
}

TEST(Gpt, ParameterGroupsAreTheOperatorGraphsOwners) {
  for (const GptConfig& g : kinds(GptConfig{2, 64, 4, 32, 256})) {
  SCOPED_TRACE(kind_of(g));
  OperatorGraph graph = build_gpt_graph(gpt_model_spec(g), 1, g.max_seq);
  std::vector<std::pair<std::string, double>> owners;
  for (std::size_t v : graph.order)
    if (graph.op(v).param_elems > 0) owners.push_back({graph.op(v).name, graph.op(v).param_elems});
  std::vector<ParamGroup> groups = gpt_param_groups(g);
  ASSERT_EQ(groups.size(), owners.size());
  std::size_t offset = 0;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    EXPECT_EQ(groups[i].name, owners[i].first);
    EXPECT_EQ(double(groups[i].elems), owners[i].second) << groups[i].name;
    EXPECT_EQ(groups[i].offset, offset) << "groups are contiguous, in graph order";
    offset += groups[i].elems;
  }
  // every parameter the model counts (model/analysis), and no other
  EXPECT_EQ(double(offset), model_param_count(gpt_model_spec(g)));
  }
}

// Every operator of the graph has an entry point, and the parameter group it uses (by role and
// block) is the one its graph node owns (the LM head: the embedding's).
TEST(Gpt, EveryOperatorOfTheGraphHasAnEntryPoint) {
  for (const GptConfig& g : kinds(GptConfig{3, 64, 4, 32, 256})) {
  SCOPED_TRACE(kind_of(g));
  const std::vector<ParamGroup> groups = gpt_param_groups(g);
  OperatorGraph graph = build_gpt_graph(gpt_model_spec(g), 1, g.max_seq);
  for (std::size_t v : graph.order) {
    const Operator& op = graph.op(v);
    const int gi = param_group_of(g, op.role, op.block);
    if (op.param_owner.empty()) {
      EXPECT_EQ(gi, -1) << op.name;
    } else {
      ASSERT_GE(gi, 0) << op.name;
      EXPECT_EQ(groups[size_t(gi)].name, op.param_owner) << op.name;
    }
  }
  EXPECT_EQ(param_group_of(g, OpRole::qkv, 3), -1) << "no block 3 in a 3-layer GPT";
  EXPECT_EQ(groups[std::size_t(param_group_of(g, OpRole::lm_head, -1))].name, g.tied_embeddings ? "embed" : "lm_head");
  }
}

TEST(Gpt, TileMajorLayoutRoundTrips) {
  for (const GptConfig& g : kinds(GptConfig{1, 32, 4, 16, 256}))
  for (const ParamGroup& grp : gpt_param_groups(g)) {
    const std::vector<float> in = randn(grp.elems, 3);
    for (int tiles : {1, 2, 4}) {
      std::vector<float> tiled(grp.elems), back(grp.elems);
      to_tile_major(grp, tiles, in.data(), tiled.data());
      from_tile_major(grp, tiles, tiled.data(), back.data());
      EXPECT_EQ(back, in) << grp.name << " tiles " << tiles;
      if (grp.linear && tiles == 2) {
        // tile 1 starts with weight row OC/2, and its bias follows its weight rows
        const std::size_t IC = std::size_t(grp.in_features), OCt = std::size_t(grp.out_features) / 2;
        EXPECT_EQ(tiled[OCt * (IC + (grp.bias ? 1 : 0))], in[OCt * IC]) << grp.name;
        if (grp.bias) {
          EXPECT_EQ(tiled[OCt * IC], in[std::size_t(grp.out_features) * IC]) << grp.name;
        }
        EXPECT_EQ(grp.elems, std::size_t(grp.out_features) * (IC + (grp.bias ? 1 : 0))) << grp.name;
      }
    }
  }
}

// One forward and backward of a 1-layer GPT through every operator, in the order the schedule runs
// them; the operator `tiled` (if any) runs tile by tile on its tile-major parameters. Returns the
// losses and every gradient in the parameter array's order.
std::pair<std::vector<float>, std::vector<float>> one_pass(const GptConfig& g, const std::string& tiled, int tiles) {
  const int B = 2, T = g.max_seq, BT = B * T;
  Rig r(g, B, T, 1, tiles);
  std::vector<int> tok(static_cast<std::size_t>(BT)), tgt(static_cast<std::size_t>(BT));
  for (int i = 0; i < BT; ++i) tok[std::size_t(i)] = (i * 7) % 256, tgt[std::size_t(i)] = (i * 3 + 1) % 256;
  r.be->ops().copy_h2d_async(r.be->ctx(), 0, r.ops->tokens(0), tok.data(), tok.size() * 4);
  r.be->ops().copy_h2d_async(r.be->ctx(), 0, r.ops->targets(0), tgt.data(), tgt.size() * 4);
  const std::vector<ParamGroup> groups = gpt_param_groups(g);
  std::vector<float> params = gpt_init_params(g, 5);
  for (const ParamGroup& grp : groups)  // the tiled group is stored tile-major, as the engine stores it
    if (grp.name == tiled) {
      std::vector<float> t(grp.elems);
      to_tile_major(grp, tiles, params.data() + grp.offset, t.data());
      std::copy(t.begin(), t.end(), params.begin() + long(grp.offset));
    }
  float* dp = r.up(params);
  float* dg = r.up(std::vector<float>(params.size(), 0.0f));
  const OperatorGraph graph = build_gpt_graph(gpt_model_spec(g), B, T);
  auto call = [&](const std::string& n, bool backward, bool recompute = false) {
    OpRef op;
    for (std::size_t v : graph.order)
      if (graph.op(v).name == n) op = OpRef{graph.op(v).role, graph.op(v).block};
    const int gi = param_group_of(g, op.kind, op.block);
    std::size_t off = 0, elems = 0;
    if (gi >= 0) off = groups[size_t(gi)].offset, elems = groups[size_t(gi)].elems;
    const int tl = n == tiled ? tiles : 1;
    for (int i = 0; i < tl; ++i) {
      const int t = backward ? tl - 1 - i : i;  // the schedule runs tiles last to first in backward
      OpCall c;
      c.op = op;
      c.tile = tl > 1 ? t : -1;
      c.tiles = tl;
      c.recompute = recompute;
      if (gi >= 0) {
        c.params = dp + off + elems / std::size_t(tl) * std::size_t(t);
        c.grads = dg + off + elems / std::size_t(tl) * std::size_t(t);
      }
      if (backward) r.ops->backward(c);
      else r.ops->forward(c);
    }
  };
  const std::vector<std::string> block = {"ln1", "qkv", "attn_scores", "attn_context", "proj", "residual1",
                                          "ln2", "fc1", "gelu", "fc2", "residual2"};
  call("embed", false);
  for (const std::string& o : block) call("block0." + o, false);
  call("ln_f", false);
  call("lm_head", false);
  call("lm_head", true);
  call("ln_f", true);
  r.ops->set_segment_input(0, r.ops->block_input(0, 0));  // the checkpoint of block 0 is its input
  for (const std::string& o : block) call("block0." + o, false, true);
  for (auto it = block.rbegin(); it != block.rend(); ++it) call("block0." + *it, true);
  call("embed", true);
  std::vector<float> grads = r.down(dg, params.size());
  for (const ParamGroup& grp : groups)
    if (grp.name == tiled) {
      std::vector<float> t(grp.elems);
      from_tile_major(grp, tiles, grads.data() + grp.offset, t.data());
      std::copy(t.begin(), t.end(), grads.begin() + long(grp.offset));
    }
  return {r.down(r.ops->losses(0), std::size_t(BT)), grads};
}

// Sec. 5.1.3: a linear operator run tile by tile, each tile's weight rows and bias in a range of
// their own, gives what the untiled operator gives: the same loss and the same gradients of every
// parameter. The tiles' output columns are the same dot products; their input gradients add up in
// another order than the untiled GEMM's, hence a tolerance instead of bit equality.
TEST(Gpt, TiledLinearEqualsTheUntiledOperator) {
  for (const GptConfig& g : kinds(GptConfig{1, 64, 4, 16, 256})) {
  SCOPED_TRACE(kind_of(g));
  const auto [loss0, grads0] = one_pass(g, "", 1);
  for (const char* name : {"block0.qkv", "block0.proj", "block0.fc1", "block0.fc2"})
    for (int tiles : {2, 4}) {
      const auto [loss, grads] = one_pass(g, name, tiles);
      EXPECT_LT(rel(loss, loss0), 1e-6) << name << " tiles " << tiles;
      EXPECT_LT(rel(grads, grads0), 1e-5) << name << " tiles " << tiles;
      for (const ParamGroup& grp : gpt_param_groups(g))
        if (grp.name == name) {
          std::vector<float> a(grads.begin() + long(grp.offset), grads.begin() + long(grp.offset + grp.elems));
          std::vector<float> b(grads0.begin() + long(grp.offset), grads0.begin() + long(grp.offset + grp.elems));
          EXPECT_LT(rel(a, b), 1e-6) << name << " tiles " << tiles << ": its own weight and bias gradients";
        }
    }
  // and the checkpointed recompute reproduces the forward: the same pass twice is bit-identical
  EXPECT_EQ(one_pass(g, "", 1).second, grads0);
  }
}

TEST(Gpt, WorkspaceIsExactlyWhatIsCarved) {
  const GptConfig g{2, 32, 4, 16, 256};
  auto be = create_backend("cpu").value();
  const std::size_t bytes = GptOps::workspace_bytes(g, 2, 16, 1, 1, 1);
  void* p = std::aligned_alloc(256, bytes);
  EXPECT_TRUE(GptOps::create(*be, g, 2, 16, 1, 1, 1, p, bytes).ok());
  EXPECT_FALSE(GptOps::create(*be, g, 2, 16, 1, 1, 1, p, bytes - 1).ok());
  EXPECT_FALSE(GptOps::create(*be, g, 2, 16, 1, 1, 3, p, bytes).ok()) << "tiling 3 does not divide 32";
  // more blocks per segment and more micro-batches need more activations
  EXPECT_GT(GptOps::workspace_bytes(g, 2, 16, 2, 1, 1), bytes);
  EXPECT_GT(GptOps::workspace_bytes(g, 2, 16, 1, 2, 1), bytes);
  std::free(p);
}
