// Interleaved 1F1B (issue 28, item 3; Narayanan et al. 2021, Sec. 2.2.2): each of pp stages holds v
// chunks of blocks, chunk k of stage s the (k pp + s)-th of pp x v virtual stages, and runs its
// (micro-batch, chunk) passes in groups of pp micro-batches. Against closed forms: the blocks
// each stage holds, the pass order and the passes in flight, v times the activation messages
// (the first stage receiving from the last and sending back), the bubble divided by v; against the
// plain schedule: the same FLOPs and parameters.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "model/memory.hpp"
#include "model/schedule.hpp"

namespace memwall {
namespace {

ModelSpec interleaved_model() { return *model_from_shape(16, 256, 4, 64, 512); }

TrainingConfig interleaved_config(int pp, int v, int m) {
  TrainingConfig c;
  c.seq = interleaved_model().seq;
  c.bsz = 2;
  c.pp = pp;
  c.virtual_stages = v;
  c.grad_accum = m;
  return c;
}

HardwareProfile one_dgx2() { return *load_profile("dgx2"); }

Schedule stage_schedule(const std::string& strategy, int pp, int v, int m, int stage) {
  Result<Schedule> s = build_schedule(interleaved_model(), *preset(strategy), interleaved_config(pp, v, m), one_dgx2(),
                                      0, MemorySizes{}, stage);
  EXPECT_TRUE(s.ok()) << strategy << " stage " << stage << ": " << (s.ok() ? "" : s.error());
  return s.ok() ? *s : Schedule{};
}

TEST(Interleaved, ChunkKOfStageSHoldsVirtualStageKppPlusS) {
  // 16 blocks, pp 4, v 2: eight virtual stages of two blocks
  for (int s = 0; s < 4; ++s) {
    const std::vector<StageBlocks> ch = stage_chunks(16, 4, 2, s);
    ASSERT_EQ(ch.size(), 2u);
    EXPECT_EQ(ch[0].first, 2 * s);
    EXPECT_EQ(ch[0].last, 2 * s + 2);
    EXPECT_EQ(ch[1].first, 8 + 2 * s);
    EXPECT_EQ(ch[1].last, 8 + 2 * s + 2);
    EXPECT_EQ(stage_block_count(16, 4, 2, s), 4);
  }
  // uneven: 10 blocks over 2 x 2 virtual stages; the stages together hold every block once
  int total = 0;
  for (int s = 0; s < 2; ++s) total += stage_block_count(10, 2, 2, s);
  EXPECT_EQ(total, 10);
  // v 1: the plain stage's blocks
  EXPECT_EQ(stage_chunks(10, 3, 1, 1).front().first, stage_blocks(10, 3, 1).first);
  EXPECT_EQ(stage_chunks(10, 3, 1, 1).front().last, stage_blocks(10, 3, 1).last);
}

// Megatron-LM's order: 2 (pp - s - 1) + (v - 1) pp forwards first; forward pass i is micro-batch
// (i / (pp v)) pp + i mod pp of chunk (i mod pp v) / pp, backward pass i the same micro-batch of
// chunk v - 1 - that; every (micro-batch, chunk) runs forward once and backward once, and a
// chunk's micro-batches run in order (its gradients are final at the last one).
TEST(Interleaved, PassOrderWarmUpAndInFlight) {
  for (int pp : {2, 4})
    for (int v : {1, 2, 3})
      for (int m : {pp, 2 * pp, 3 * pp})
        for (int s = 0; s < pp; ++s) {
          SCOPED_TRACE("pp " + std::to_string(pp) + " v " + std::to_string(v) + " m " + std::to_string(m) + " stage " +
                       std::to_string(s));
          const std::vector<PipelinePass> order = pipeline_order(pp, v, m, s);
          ASSERT_EQ(order.size(), size_t(2 * m * v));
          const int warmup = std::min(v == 1 ? pp - s - 1 : 2 * (pp - s - 1) + (v - 1) * pp, m * v);
          int leading = 0;
          while (leading < int(order.size()) && order[size_t(leading)].forward) ++leading;
          EXPECT_EQ(leading, std::min(warmup + 1, m * v));
          std::set<std::pair<int, int>> fwd, bwd;
          std::vector<int> last_fwd(size_t(v), -1), last_bwd(size_t(v), -1);
          for (const PipelinePass& x : order) {
            auto& seen = x.forward ? fwd : bwd;
            EXPECT_TRUE(seen.insert({x.micro_batch, x.chunk}).second);
            if (!x.forward) {
              EXPECT_TRUE(fwd.count({x.micro_batch, x.chunk})) << "backward before its forward";
            }
            auto& last = x.forward ? last_fwd : last_bwd;
            EXPECT_GT(x.micro_batch, last[size_t(x.chunk)]);
            last[size_t(x.chunk)] = x.micro_batch;
          }
          EXPECT_EQ(fwd.size(), size_t(m * v));
          EXPECT_EQ(bwd.size(), size_t(m * v));
          EXPECT_EQ(pipeline_in_flight(pp, v, m, s), std::min(warmup + 1, m * v));
        }
}

// The schedule runs the passes in that order; each chunk receives its input from the stage before
// (the first stage's later chunks from the last stage) and sends its output on, and the gradients
// go the other way: v m messages each way per stage, less the pipeline's two ends.
TEST(Interleaved, ScheduleFollowsTheOrderAndSendsVTimesTheMessages) {
  const int pp = 4, v = 2, m = 8;
  const ModelSpec model = interleaved_model();
  for (int s = 0; s < pp; ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    const Schedule st = stage_schedule("zero3", pp, v, m, s);
    EXPECT_TRUE(check_invariants(st).empty());
    const std::vector<StageBlocks> ch = stage_chunks(model.layers, pp, v, s);
    auto chunk_of = [&](int block) {
      for (int k = 0; k < v; ++k)
        if (block >= ch[size_t(k)].first && block < ch[size_t(k)].last) return k;
      return -1;
    };
    std::vector<PipelinePass> passes;
    for (const Step& x : st.steps) {
      if (x.kind != StepKind::compute || x.phase == Phase::recompute || x.op < 0) continue;
      const int blk = st.ops[size_t(x.op)].block;
      if (blk < 0) continue;  // the embedding and head run inside their chunk's pass
      const int k = chunk_of(blk);
      ASSERT_GE(k, 0) << "block " << blk << " is not this stage's";
      const PipelinePass p{x.phase == Phase::forward, x.accum_step, k};
      if (passes.empty() || passes.back().forward != p.forward || passes.back().micro_batch != p.micro_batch ||
          passes.back().chunk != p.chunk)
        passes.push_back(p);
    }
    const std::vector<PipelinePass> expected = pipeline_order(pp, v, m, s);
    ASSERT_EQ(passes.size(), expected.size());
    for (size_t i = 0; i < passes.size(); ++i) {
      EXPECT_EQ(passes[i].forward, expected[i].forward) << i;
      EXPECT_EQ(passes[i].micro_batch, expected[i].micro_batch) << i;
      EXPECT_EQ(passes[i].chunk, expected[i].chunk) << i;
    }
    int recv_f = 0, send_f = 0, recv_b = 0, send_b = 0;
    double p2p_bytes = 0;
    const double message = 2.0 * 2 * model.seq * model.hidden;  // bsz 2, fp16, mp 1
    for (const Step& x : st.steps)
      if (x.kind == StepKind::p2p) {
        const bool from_prev = (x.phase == Phase::forward) == (x.hop == Hop::recv);
        EXPECT_EQ(x.collective.root, from_prev ? (s + pp - 1) % pp : (s + 1) % pp);
        EXPECT_DOUBLE_EQ(x.bytes, message);
        p2p_bytes += x.bytes;
        (x.phase == Phase::forward ? (x.hop == Hop::recv ? recv_f : send_f) : (x.hop == Hop::recv ? recv_b : send_b))++;
      }
    const int starts = s == 0 ? m : 0, ends = s == pp - 1 ? m : 0;  // the embedding's chunk, the head's
    EXPECT_EQ(recv_f, m * v - starts);
    EXPECT_EQ(send_b, m * v - starts);
    EXPECT_EQ(send_f, m * v - ends);
    EXPECT_EQ(recv_b, m * v - ends);
    EXPECT_DOUBLE_EQ(p2p_bytes, message * (4.0 * m * v - 2.0 * (starts + ends)));
    // checkpoints alive at once: the passes in flight, each its chunk's blocks (ci 1)
    std::set<std::string> live;
    size_t most = 0;
    for (const Step& x : st.steps) {
      for (int b : x.allocs)
        if (st.buffers[size_t(b)].kind == BufferKind::ckpt) live.insert(st.buffers[size_t(b)].name);
      most = std::max(most, live.size());
      for (int f : x.frees) live.erase(st.buffers[size_t(f)].name);
    }
    EXPECT_EQ(most, size_t(ch[0].last - ch[0].first) * size_t(pipeline_in_flight(pp, v, m, s)));
  }
}

// Interleaving moves work between passes, not between stages' totals: the stages' FLOPs add up to
// the plain pipeline's, and so do their parameters; every preset keeps the schedule's invariants.
TEST(Interleaved, SameWorkAndParametersAsPlainStages) {
  const int pp = 2, m = 4;
  for (const char* name : {"data_parallel", "zero2", "zero3", "zero_inf_cpu", "zero_inf_nvme", "three_d"})
    for (int v : {2, 4}) {
      SCOPED_TRACE(std::string(name) + " v " + std::to_string(v));
      double flops_v = 0, flops_1 = 0, params_v = 0, params_1 = 0;
      for (int s = 0; s < pp; ++s) {
        const Schedule a = stage_schedule(name, pp, v, m, s), b = stage_schedule(name, pp, 1, m, s);
        const std::vector<std::string> bad = check_invariants(a);
        EXPECT_TRUE(bad.empty()) << "stage " << s << ": " << (bad.empty() ? "" : bad.front());
        flops_v += a.compute_flops;
        flops_1 += b.compute_flops;
        for (int t = 0; t < kTiers; ++t) {
          params_v += a.persistent_bytes[size_t(t)][int(State::param16)];
          params_1 += b.persistent_bytes[size_t(t)][int(State::param16)];
        }
      }
      EXPECT_NEAR(flops_v, flops_1, 1e-9 * flops_1);
      EXPECT_NEAR(params_v, params_1, 1e-9 * params_1);
    }
}

// The memory model follows the interleaved schedule's walk as it follows the plain one's.
TEST(Interleaved, MemoryModelHoldsTheWalk) {
  const int pp = 4, m = 8;
  for (const char* name : {"three_d", "zero3", "zero_inf_cpu"})
    for (int v : {1, 2, 4})
      for (int s = 0; s < pp; ++s) {
        SCOPED_TRACE(std::string(name) + " v " + std::to_string(v) + " stage " + std::to_string(s));
        TrainingConfig c = *fit_to_profile(interleaved_config(pp, v, m), one_dgx2());
        c.bsz = 32;  // checkpoints of the passes in flight a large share of the peak
        const Schedule st = *build_schedule(interleaved_model(), *preset(name), c, one_dgx2(), 0, MemorySizes{}, s);
        const MemoryModel mm = memory_model(interleaved_model(), *preset(name), c, one_dgx2(), 0, MemorySizes{}, s);
        const double walk = st.peak_bytes[int(Tier::gpu)], predicted = mm.of(Tier::gpu).peak_bytes;
        EXPECT_NEAR(predicted / walk, 1.0, 0.02) << "predicted " << predicted << ", walked " << walk;
      }
}

// The stage that holds the most is not always the first or the last: 62 blocks over 8 x 4 chunks
// give stage 0 a first chunk of one block and stage 1 chunks of two (stage_blocks rounds down), so
// stage 1 holds more blocks, and more of their checkpoints, than stage 0 (the planner checked
// stages 0 and pp - 1 only and chose a 50B plan on 8 DGX-2 nodes whose stages 1 and 2 overflow).
// fullest_stages skips only stages a stage before them dominates; against every stage's model.
TEST(Interleaved, FullestStagesAreTheLargestOfEveryStage) {
  const HardwareProfile p = *scale_to_nodes(one_dgx2(), 8);
  bool middle = false;
  for (int layers : {16, 50, 62})
    for (int pp : {2, 3, 8})
      for (int v : {1, 2, 4})
        for (Tier ckpt : {Tier::gpu, Tier::cpu}) {
          if (layers < pp * v) continue;
          const ModelSpec m = *model_from_shape(layers, 256, 4, 64, 512);
          TrainingConfig c = interleaved_config(pp, v, 2 * pp);
          c.seq = m.seq;
          c.bsz = 32;
          c = *fit_to_profile(c, p);
          Placement pl = *preset("three_d");
          pl.act_ckpt.tier = ckpt;
          const FullestStages fs = fullest_stages(m, pl, c, p);
          for (Tier t : {Tier::gpu, Tier::cpu}) {
            double most = 0;
            for (int s = 0; s < pp; ++s) most = std::max(most, memory_model(m, pl, c, p, 0, {}, s).of(t).peak_bytes);
            const int at = fs.stage[size_t(t)];
            EXPECT_EQ(fs.of(t).of(t).peak_bytes, most)
                << layers << " blocks, pp " << pp << ", v " << v << ", " << to_string(t) << " at stage " << at;
            EXPECT_EQ(fs.of(t).of(t).peak_bytes, memory_model(m, pl, c, p, 0, {}, at).of(t).peak_bytes);
            if (t == Tier::gpu && at > 0 && at < pp - 1) middle = true;
          }
        }
  EXPECT_TRUE(middle) << "a case where a stage between the first and the last holds the most";
  // the case the planner missed, walked: stage 1 peaks above stage 0 and the last, and the model
  // names it
  const ModelSpec m = *model_from_shape(62, 256, 4, 64, 512);
  TrainingConfig c = interleaved_config(8, 4, 16);
  c.seq = m.seq;
  c.bsz = 32;
  c = *fit_to_profile(c, p);
  const Placement pl = *preset("three_d");
  auto walked = [&](int s) {
    return build_schedule(m, pl, c, p, 0, MemorySizes{}, s)->peak_bytes[size_t(Tier::gpu)];
  };
  EXPECT_GT(walked(1), walked(0));
  EXPECT_GT(walked(1), walked(7));
  EXPECT_EQ(fullest_stages(m, pl, c, p).stage[size_t(Tier::gpu)], 1);
}

TEST(Interleaved, BubbleShrinksVFold) {
  EXPECT_DOUBLE_EQ(pipeline_bubble(4, 8, 1), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble(4, 8, 2), 3.0 / 19.0);
  EXPECT_DOUBLE_EQ(pipeline_bubble(4, 8, 4), 3.0 / 35.0);
}

TEST(Interleaved, BadChunksAreRefusedWithTheFlag) {
  auto error = [](TrainingConfig c) {
    Result<Schedule> s = build_schedule(interleaved_model(), *preset("zero3"), c, one_dgx2(), 0, MemorySizes{}, 0);
    return s.ok() ? std::string("accepted") : s.error();
  };
  TrainingConfig c = interleaved_config(1, 2, 4);
  EXPECT_NE(error(c).find("--virtual-stages: interleaving needs pipeline stages"), std::string::npos) << error(c);
  c = interleaved_config(4, 2, 6);
  EXPECT_NE(error(c).find("--grad-accum: interleaved 1F1B runs micro-batches in groups of pp"), std::string::npos)
      << error(c);
  c = interleaved_config(4, 5, 8);
  EXPECT_NE(error(c).find("--virtual-stages: expected 1 to 4 chunks"), std::string::npos) << error(c);
  c = interleaved_config(4, 0, 8);
  EXPECT_NE(error(c).find("--virtual-stages"), std::string::npos) << error(c);
}

}  // namespace
}  // namespace memwall
