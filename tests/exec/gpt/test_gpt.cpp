// exec/gpt: parameter groups against the operator graph, the memory refusal, run-to-run
// determinism, checkpointing that leaves losses unchanged, and run-config errors. The numerical
// comparison with PyTorch is torch_reference.py (ctest gpt.torch_reference).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "exec/gpt/train.hpp"
#include "model/model_spec.hpp"
#include "model/operator_graph.hpp"

using namespace memwall;
using namespace memwall::exec;

namespace {

RunConfig tiny(int ci = 0) {
  RunConfig c;
  c.model = GptConfig{3, 32, 4, 16, 256};
  c.bsz = 2;
  c.seq = 16;
  c.ci = ci;
  c.lr = 1e-2;
  c.corpus = default_corpus_path();
  return c;
}

std::vector<float> losses(const RunConfig& cfg, int steps) {
  auto t = Trainer::create(cfg);
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error());
  auto corpus = Corpus::load(cfg.corpus);
  EXPECT_TRUE(corpus.ok());
  std::uint64_t rng = 99;
  std::vector<int> tok, tgt;
  std::vector<float> out;
  for (int s = 0; s < steps; ++s) {
    corpus->next_batch(cfg.bsz, cfg.seq, rng, tok, tgt);
    out.push_back((*t)->step(tok, tgt).value());
  }
  return out;
}

}  // namespace

TEST(Gpt, ParameterGroupsAreTheOperatorGraphsOwners) {
  const GptConfig g{2, 64, 4, 32, 256};
  ModelSpec spec;
  spec.layers = g.layers;
  spec.hidden = g.hidden;
  spec.heads = g.heads;
  spec.seq = g.max_seq;
  spec.vocab = g.vocab;
  OperatorGraph graph = build_gpt_graph(spec, 1, g.max_seq);
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
}

TEST(Gpt, GroupLookup) {
  auto backend = create_backend("cpu").value();
  auto gpt = Gpt::create(*backend, GptConfig{2, 32, 4, 16, 256}, 1, 16, 0);
  ASSERT_TRUE(gpt.ok());
  EXPECT_EQ((*gpt)->group("block1.fc1").value().elems, std::size_t(4 * 32 * 32 + 4 * 32));
  EXPECT_FALSE((*gpt)->group("block9.fc1").ok());
}

// What a ZeRO-3 engine does: a group's weights and gradients in buffers of its own.
TEST(Gpt, GroupBoundToItsOwnBuffersGivesTheSameLossAndGradients) {
  auto be = create_backend("cpu").value();
  const GptConfig cfg{2, 32, 4, 16, 256};
  auto gpt = Gpt::create(*be, cfg, 2, 16, 1).value();
  const BackendOps& k = be->ops();
  std::vector<float> p = gpt_init_params(cfg, 3);
  std::vector<int> tok(32), tgt(32);
  for (int i = 0; i < 32; ++i) tok[std::size_t(i)] = (i * 37) % 256, tgt[std::size_t(i)] = (i * 11) % 256;
  k.copy_h2d_async(be->ctx(), 0, gpt->params(), p.data(), p.size() * 4);
  k.copy_h2d_async(be->ctx(), 0, gpt->tokens(), tok.data(), 32 * 4);
  k.copy_h2d_async(be->ctx(), 0, gpt->targets(), tgt.data(), 32 * 4);
  auto run = [&] {
    gpt->zero_grad();
    gpt->forward();
    const float loss = gpt->loss();
    gpt->backward();
    std::vector<float> g(gpt->num_params());
    k.copy_d2h_async(be->ctx(), 0, g.data(), gpt->grads(), g.size() * 4);
    k.synchronize(be->ctx());
    return std::make_pair(loss, g);
  };
  const auto [loss0, grads0] = run();
  const ParamGroup qkv = gpt->group("block1.qkv").value();
  float* w = alloc_array<float>(*be, qkv.elems).value();
  float* dw = alloc_array<float>(*be, qkv.elems).value();
  k.copy_d2d_async(be->ctx(), 0, w, gpt->params() + qkv.offset, qkv.elems * 4);
  k.memset_zero(be->ctx(), gpt->params() + qkv.offset, qkv.elems * 4);  // the old slot must be unused
  ASSERT_TRUE(gpt->bind_group("block1.qkv", w, dw).ok());
  const auto [loss1, grads1] = run();
  EXPECT_EQ(loss1, loss0);
  std::vector<float> own(qkv.elems);
  k.copy_d2h_async(be->ctx(), 0, own.data(), dw, own.size() * 4);
  k.synchronize(be->ctx());
  EXPECT_EQ(own, std::vector<float>(grads0.begin() + long(qkv.offset), grads0.begin() + long(qkv.offset + qkv.elems)));
  for (std::size_t i = 0; i < grads1.size(); ++i)
    if (i < qkv.offset || i >= qkv.offset + qkv.elems) ASSERT_EQ(grads1[i], grads0[i]) << i;
    else ASSERT_EQ(grads1[i], 0.0f) << "the group's old gradient slot is left alone";
  EXPECT_FALSE(gpt->bind_group("block7.qkv", w, dw).ok());
  ASSERT_TRUE(gpt->bind_group("block1.qkv", nullptr, nullptr).ok());
  k.free(be->ctx(), w);
  k.free(be->ctx(), dw);
}

TEST(Gpt, RefusesAModelLargerThanTheDevice) {
  RunConfig c = tiny();
  c.capacity_bytes = 100000;
  auto t = Trainer::create(c);
  ASSERT_FALSE(t.ok());
  const std::size_t need = gpt_memory(c.model, c.bsz, c.seq, c.ci).total();
  EXPECT_NE(t.error().find("needs " + std::to_string(need) + " bytes"), std::string::npos) << t.error();
  EXPECT_NE(t.error().find("but 100000 bytes"), std::string::npos) << t.error();
}

TEST(Gpt, MemoryEstimateIsWhatTheModelAllocates) {
  for (int ci : {0, 1, 2}) {
    const GptConfig g{3, 32, 4, 16, 256};
    auto backend = create_backend("cpu").value();
    auto gpt = Gpt::create(*backend, g, 2, 16, ci);
    ASSERT_TRUE(gpt.ok());
    EXPECT_EQ(backend->ops().used_bytes(backend->ctx()), gpt_memory(g, 2, 16, ci).total()) << "ci " << ci;
  }
  EXPECT_LT(gpt_memory(GptConfig{8, 64, 4, 64, 256}, 4, 64, 1).total(),
            gpt_memory(GptConfig{8, 64, 4, 64, 256}, 4, 64, 0).total());
}

TEST(Gpt, SameSeedSameLosses) {
  const std::vector<float> a = losses(tiny(), 5), b = losses(tiny(), 5);
  EXPECT_EQ(a, b);
}

TEST(Gpt, CheckpointingKeepsLossesBitForBit) {
  const std::vector<float> a = losses(tiny(0), 4);
  EXPECT_EQ(losses(tiny(1), 4), a);
  EXPECT_EQ(losses(tiny(2), 4), a);
}

TEST(Gpt, LossFalls) {
  RunConfig c = tiny();
  c.model = GptConfig{2, 64, 4, 32, 256};
  c.seq = 32;
  c.bsz = 4;
  c.lr = 3e-3;
  const std::vector<float> l = losses(c, 60);
  EXPECT_GT(l.front(), 5.0f);
  EXPECT_LT(l.back(), 3.6f) << "a 2-layer model learns byte statistics within 60 steps";
}

TEST(RunConfig, Errors) {
  auto err = [](std::string_view yaml) {
    auto r = parse_run_config("run.yaml", yaml);
    return r.ok() ? std::string("(ok)") : r.error();
  };
  EXPECT_EQ(err("layers: 2\nhiden: 64\n").rfind("run.yaml:2: hiden: unknown field", 0), 0u) << err("layers: 2\nhiden: 64\n");
  EXPECT_NE(err("lr: fast\n").find("run.yaml:1: lr: expected a number > 0"), std::string::npos);
  EXPECT_NE(err("hidden: 30\nheads: 4\n").find("hidden: expected a multiple of heads (4), got 30"), std::string::npos);
  EXPECT_NE(err("backend: tpu\n").find("backend: expected cpu or cuda"), std::string::npos);
  EXPECT_NE(err("corpus: /nonexistent/x.txt\n").find("run.yaml:1: corpus: no such file"), std::string::npos);
  EXPECT_NE(err("capacity: 12\n").find("run.yaml:1: capacity:"), std::string::npos);
  EXPECT_NE(err("ci: 9\nlayers: 2\n").find("ci: expected at most 2"), std::string::npos);
  auto ok = parse_run_config("run.yaml", "layers: 2\nhidden: 64\nheads: 4\nseq: 32\nci: 1\ncapacity: 64 MiB\nlr: 3e-4\n");
  ASSERT_TRUE(ok.ok()) << ok.error();
  EXPECT_EQ(ok->model.max_seq, 32);
  EXPECT_EQ(ok->capacity_bytes, std::size_t(64) << 20);
  EXPECT_DOUBLE_EQ(ok->lr, 3e-4);
}
