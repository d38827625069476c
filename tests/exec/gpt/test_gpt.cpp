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
// them; the operator `tiled` (if any) runs tile by tile on its tile-major parameters. With mp > 1,
// the model's mp slices (mp_slice) run side by side, each from the slice of the whole's initial
// weights it holds, their partial sums added where the schedule all-reduces them (proj's and fc2's
// outputs in forward and recompute, qkv's and fc1's input gradients in backward). Returns the
// losses (of slice 0) and each slice's gradients in its parameter array's order.
struct Pass {
  std::vector<float> losses;
  std::vector<std::vector<float>> grads;  // per slice
};
Pass one_pass(const GptConfig& whole, const std::string& tiled, int tiles, int mp = 1) {
  const int B = 2, T = whole.max_seq, BT = B * T;
  std::vector<std::unique_ptr<Rig>> rigs;
  const std::size_t slices = static_cast<std::size_t>(mp);
  std::vector<float*> dp(slices), dg(slices);
  std::vector<std::size_t> n(slices);
  std::vector<int> tok(static_cast<std::size_t>(BT)), tgt(static_cast<std::size_t>(BT));
  for (int i = 0; i < BT; ++i) tok[std::size_t(i)] = (i * 7) % 256, tgt[std::size_t(i)] = (i * 3 + 1) % 256;
  const std::vector<float> whole_params = gpt_init_params(whole, 5);
  for (int r = 0; r < mp; ++r) {
    const GptConfig g = mp_slice(whole, mp, r);
    rigs.push_back(std::make_unique<Rig>(g, B, T, 1, tiles));
    Rig& rig = *rigs.back();
    rig.be->ops().copy_h2d_async(rig.be->ctx(), 0, rig.ops->tokens(0), tok.data(), tok.size() * 4);
    rig.be->ops().copy_h2d_async(rig.be->ctx(), 0, rig.ops->targets(0), tgt.data(), tgt.size() * 4);
    std::vector<float> params = gpt_init_params(g, 5);
    if (mp > 1) {  // a slice's initial weights are the whole's, element for element
      const std::vector<std::size_t> at = gpt_slice_indices(g);
      for (std::size_t i = 0; i < params.size(); ++i) EXPECT_EQ(params[i], whole_params[at[i]]) << "slice " << r << " " << i;
    }
    for (const ParamGroup& grp : gpt_param_groups(g))  // the tiled group is stored tile-major, as the engine stores it
      if (grp.name == tiled) {
        std::vector<float> t(grp.elems);
        to_tile_major(grp, tiles, params.data() + grp.offset, t.data());
        std::copy(t.begin(), t.end(), params.begin() + long(grp.offset));
      }
    n[size_t(r)] = params.size();
    dp[size_t(r)] = rig.up(params);
    dg[size_t(r)] = rig.up(std::vector<float>(params.size(), 0.0f));
  }
  const OperatorGraph graph = build_gpt_graph(gpt_model_spec(whole), B, T);
  // the all-reduce over the slices: sum every slice's (B, T, C) partial sums, give each the sum
  auto all_reduce = [&](OpRole kind, bool backward) {
    std::vector<float> sum(std::size_t(BT) * std::size_t(whole.hidden), 0.0f);
    for (auto& rig : rigs) {
      const std::vector<float> part = rig->down(rig->ops->mp_partial_sums(kind, 0, backward, 0), sum.size());
      for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
    }
    for (auto& rig : rigs) {
      rig->be->ops().copy_h2d_async(rig->be->ctx(), 0, rig->ops->mp_partial_sums(kind, 0, backward, 0), sum.data(),
                                    sum.size() * 4);
      rig->be->ops().synchronize(rig->be->ctx());
    }
  };
  auto call = [&](const std::string& name, bool backward, bool recompute = false) {
    OpRef op;
    for (std::size_t v : graph.order)
      if (graph.op(v).name == name) op = OpRef{graph.op(v).role, graph.op(v).block};
    for (int r = 0; r < mp; ++r) {
      const GptConfig& g = rigs[size_t(r)]->cfg;
      const std::vector<ParamGroup> groups = gpt_param_groups(g);
      const int gi = param_group_of(g, op.kind, op.block);
      std::size_t off = 0, elems = 0;
      if (gi >= 0) off = groups[size_t(gi)].offset, elems = groups[size_t(gi)].elems;
      const int tl = name == tiled ? tiles : 1;
      for (int i = 0; i < tl; ++i) {
        const int t = backward ? tl - 1 - i : i;  // the schedule runs tiles last to first in backward
        OpCall c;
        c.op = op;
        c.tile = tl > 1 ? t : -1;
        c.tiles = tl;
        c.recompute = recompute;
        if (gi >= 0) {
          c.params = dp[size_t(r)] + off + elems / std::size_t(tl) * std::size_t(t);
          c.grads = dg[size_t(r)] + off + elems / std::size_t(tl) * std::size_t(t);
        }
        if (backward) rigs[size_t(r)]->ops->backward(c);
        else rigs[size_t(r)]->ops->forward(c);
      }
    }
    const bool fwd_point = op.kind == OpRole::proj || op.kind == OpRole::fc2;
    const bool bwd_point = op.kind == OpRole::qkv || op.kind == OpRole::fc1;
    if (mp > 1 && (backward ? bwd_point : fwd_point)) all_reduce(op.kind, backward);
  };
  const std::vector<std::string> block = {"ln1", "qkv", "attn_scores", "attn_context", "proj", "residual1",
                                          "ln2", "fc1", "gelu", "fc2", "residual2"};
  call("embed", false);
  for (const std::string& o : block) call("block0." + o, false);
  call("ln_f", false);
  call("lm_head", false);
  call("lm_head", true);
  call("ln_f", true);
  for (auto& rig : rigs) rig->ops->set_segment_input(0, rig->ops->block_input(0, 0));  // block 0's checkpoint: its input
  for (const std::string& o : block) call("block0." + o, false, true);
  for (auto it = block.rbegin(); it != block.rend(); ++it) call("block0." + *it, true);
  call("embed", true);
  Pass out;
  for (int r = 0; r < mp; ++r) {
    Rig& rig = *rigs[size_t(r)];
    std::vector<float> grads = rig.down(dg[size_t(r)], n[size_t(r)]);
    for (const ParamGroup& grp : gpt_param_groups(rig.cfg))
      if (grp.name == tiled) {
        std::vector<float> t(grp.elems);
        from_tile_major(grp, tiles, grads.data() + grp.offset, t.data());
        std::copy(t.begin(), t.end(), grads.begin() + long(grp.offset));
      }
    out.grads.push_back(std::move(grads));
  }
  out.losses = rigs[0]->down(rigs[0]->ops->losses(0), std::size_t(BT));
  return out;
}

// Sec. 5.1.3: a linear operator run tile by tile, each tile's weight rows and bias in a range of
// their own, gives what the untiled operator gives: the same loss and the same gradients of every
// parameter. The tiles' output columns are the same dot products; their input gradients add up in
// another order than the untiled GEMM's, hence a tolerance instead of bit equality.
TEST(Gpt, TiledLinearEqualsTheUntiledOperator) {
  for (const GptConfig& g : kinds(GptConfig{1, 64, 4, 16, 256})) {
  SCOPED_TRACE(kind_of(g));
  const Pass ref = one_pass(g, "", 1);
  const std::vector<float>& loss0 = ref.losses;
  const std::vector<float>& grads0 = ref.grads[0];
  for (const char* name : {"block0.qkv", "block0.proj", "block0.fc1", "block0.fc2"})
    for (int tiles : {2, 4}) {
      const Pass p = one_pass(g, name, tiles);
      const std::vector<float>& loss = p.losses;
      const std::vector<float>& grads = p.grads[0];
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
  EXPECT_EQ(one_pass(g, "", 1).grads[0], grads0);
  }
}

// Tensor slicing (Megatron-LM, issue 26): the model's mp slices, their partial sums all-reduced
// after proj and fc2 (forward, recompute) and after qkv and fc1 (backward), give the whole model's
// losses, and every slice's gradient of every parameter it holds equals the whole's gradient of that
// parameter: sliced ones (its heads' q, k, v rows, its fc1 rows, its columns of proj and fc2) and
// replicated ones (embeddings, norms, proj's and fc2's biases) alike. Tiled slices too. The whole
// model is the one gpt.torch_reference checks against PyTorch. Tolerances: the all-reduce adds the
// slices' dot products in another order than the whole GEMM.
TEST(Gpt, TensorSlicesEqualTheWholeModel) {
  for (const GptConfig& g : kinds(GptConfig{1, 64, 4, 16, 256})) {
    SCOPED_TRACE(kind_of(g));
    const Pass ref = one_pass(g, "", 1);
    for (int mp : {2, 4})
      for (auto [tiled, tiles] : {std::pair<const char*, int>{"", 1}, {"block0.fc2", 2}, {"block0.qkv", 2}}) {
        if (!check_mp_slicing(g, mp).ok()) continue;  // more slices than key/value heads
        SCOPED_TRACE("mp " + std::to_string(mp) + " " + tiled);
        const Pass p = one_pass(g, tiled, tiles, mp);
        EXPECT_LT(rel(p.losses, ref.losses), 1e-6);
        std::vector<int> held(ref.grads[0].size(), 0);
        for (int r = 0; r < mp; ++r) {
          const std::vector<std::size_t> at = gpt_slice_indices(mp_slice(g, mp, r));
          ASSERT_EQ(at.size(), p.grads[size_t(r)].size());
          std::vector<float> mine, whole;
          for (std::size_t i = 0; i < at.size(); ++i) {
            mine.push_back(p.grads[size_t(r)][i]);
            whole.push_back(ref.grads[0][at[i]]);
            ++held[at[i]];
          }
          EXPECT_LT(rel(mine, whole), 1e-5) << "slice " << r;
        }
        // every parameter is held: by one slice, or by all of them (replicated)
        for (std::size_t i = 0; i < held.size(); ++i)
          ASSERT_TRUE(held[i] == 1 || held[i] == mp) << "parameter " << i << " held by " << held[i] << " slices";
      }
  }
  EXPECT_FALSE(check_mp_slicing(GptConfig{1, 64, 4, 16, 256}, 3).ok()) << "3 slices of 4 heads";
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
