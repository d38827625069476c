// Pipeline stages in the schedule (issue 17, item 4): each stage computes a contiguous range of
// blocks, holds their parameters, runs its micro-steps 1F1B and exchanges activations and their
// gradients with its neighbours. Against the schedule without stages: the stages' FLOPs add up to
// it, their parameters too (plus the last stage's copy of the tied embedding), and the checkpoints
// alive at once are those of the micro-batches in flight.
#include <gtest/gtest.h>

#include <cstdio>
#include <functional>
#include <set>

#include "model/memory.hpp"
#include "model/schedule.hpp"

namespace memwall {
namespace {

ModelSpec stage_model() { return *model_from_shape(6, 256, 4, 64, 512); }

TrainingConfig stage_config(int pp, int grad_accum, int mp) {
  TrainingConfig c;
  c.seq = stage_model().seq;
  c.bsz = 2;
  c.pp = pp;
  c.mp = mp;
  c.grad_accum = grad_accum;
  return c;
}

Schedule make_stage(const std::string& strategy, int pp, int stage, int grad_accum, const HardwareProfile& p,
                    int mp = 1) {
  Result<Schedule> s =
      build_schedule(stage_model(), *preset(strategy), stage_config(pp, grad_accum, mp), p, 0, MemorySizes{}, stage);
  EXPECT_TRUE(s.ok()) << strategy << " stage " << stage << ": " << (s.ok() ? "" : s.error());
  return s.ok() ? *s : Schedule{};
}

HardwareProfile dgx2_nodes(int nodes = 1) { return *scale_to_nodes(*load_profile("dgx2"), nodes); }

const char* const kStagedPresets[] = {"data_parallel", "zero2",         "zero_offload", "zero3",
                                "zero_inf_cpu",  "zero_inf_nvme", "three_d"};

TEST(Pipeline, StagesKeepTheInvariantsAndSplitTheWork) {
  const HardwareProfile p = dgx2_nodes();
  for (const char* name : kStagedPresets)
    for (int pp : {2, 3})
      for (int ga : {1, 4}) {
        SCOPED_TRACE(std::string(name) + " pp " + std::to_string(pp) + " ga " + std::to_string(ga));
        const int mp = std::string(name) == "three_d" ? 2 : 1;
        // the same work without stages, on as many data-parallel ranks as each stage has
        TrainingConfig c = stage_config(1, ga, mp);
        c.dp = p.total_gpus() / (mp * pp);
        const Schedule whole = *build_schedule(stage_model(), *preset(name), c, p);
        double flops = 0;
        for (int s = 0; s < pp; ++s) {
          const Schedule st = make_stage(name, pp, s, ga, p, mp);
          EXPECT_EQ(st.dp, c.dp);
          const std::vector<std::string> bad = check_invariants(st);
          EXPECT_TRUE(bad.empty()) << "stage " << s << ": " << bad.front();
          flops += st.compute_flops;
        }
        EXPECT_NEAR(flops, whole.compute_flops, 1e-9 * whole.compute_flops);
      }
}

// data_parallel keeps every parameter whole on each GPU: a stage holds exactly its operators'.
TEST(Pipeline, EachStageHoldsItsBlocksParametersAndTheLastACopyOfTheEmbedding) {
  const HardwareProfile p = dgx2_nodes();
  const ModelSpec m = stage_model();
  const Schedule whole = make_stage("data_parallel", 1, 0, 1, p);
  // the last stage's copy of the embedding operator's parameters (tokens and positions: one
  // parameter group in the operator graph), fp16
  const double copy = 2.0 * double(m.vocab + m.seq) * double(m.hidden);
  for (int pp : {2, 3, 6}) {
    double sum = 0;
    for (int s = 0; s < pp; ++s)
      sum += make_stage("data_parallel", pp, s, 1, p).persistent_bytes[int(Tier::gpu)][int(State::param16)];
    EXPECT_NEAR(sum, whole.persistent_bytes[int(Tier::gpu)][int(State::param16)] + copy, 1e-6 * sum) << pp;
  }
}

// 1F1B: stage s runs min(pp - s - 1, m) forwards first, then one forward and one backward in turn;
// its receives and sends follow that order, and it holds the checkpoints of at most
// min(pp - s, m) micro-batches at once: the activation memory of the micro-batches in flight.
TEST(Pipeline, OneForwardOneBackwardAndTheMicroBatchesInFlight) {
  const HardwareProfile p = dgx2_nodes();
  const int pp = 3, m = 5;
  for (int s = 0; s < pp; ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    const Schedule st = make_stage("zero3", pp, s, m, p);
    // the order of micro-steps, from the computes
    std::vector<std::pair<Phase, int>> order;
    for (const Step& x : st.steps)
      if (x.kind == StepKind::compute && x.phase != Phase::recompute &&
          (order.empty() || order.back() != std::make_pair(x.phase, x.accum_step)))
        order.push_back({x.phase, x.accum_step});
    const int warmup = std::min(pp - s - 1, m);
    std::vector<std::pair<Phase, int>> expected;
    for (int u = 0; u < warmup; ++u) expected.push_back({Phase::forward, u});
    for (int j = 0; j < m - warmup; ++j) {
      expected.push_back({Phase::forward, warmup + j});
      expected.push_back({Phase::backward, j});
    }
    for (int j = m - warmup; j < m; ++j) expected.push_back({Phase::backward, j});
    EXPECT_EQ(order, expected);
    // p2p: receives from the stage before (forward) and after (backward), sends the other way
    int recv_f = 0, send_f = 0, recv_b = 0, send_b = 0;
    for (const Step& x : st.steps)
      if (x.kind == StepKind::p2p) {
        EXPECT_NE(x.hop, Hop::mp);  // mp 1: no all-gather of the received parts
        EXPECT_GT(x.bytes, 0);
        EXPECT_EQ(x.collective.root, x.hop == Hop::recv ? (x.phase == Phase::forward ? s - 1 : s + 1)
                                          : (x.phase == Phase::forward ? s + 1 : s - 1));
        (x.phase == Phase::forward ? (x.hop == Hop::recv ? recv_f : send_f) : (x.hop == Hop::recv ? recv_b : send_b))++;
      }
    EXPECT_EQ(recv_f, s > 0 ? m : 0);
    EXPECT_EQ(send_b, s > 0 ? m : 0);
    EXPECT_EQ(send_f, s < pp - 1 ? m : 0);
    EXPECT_EQ(recv_b, s < pp - 1 ? m : 0);
    // checkpoints alive at once
    std::set<std::string> live;
    size_t most = 0;
    for (const Step& x : st.steps) {
      for (int b : x.allocs)
        if (st.buffers[size_t(b)].kind == BufferKind::ckpt) live.insert(st.buffers[size_t(b)].name);
      most = std::max(most, live.size());
      for (int f : x.frees) live.erase(st.buffers[size_t(f)].name);
    }
    const StageBlocks blocks = stage_blocks(stage_model().layers, pp, s);
    const size_t per_micro_step = size_t(blocks.last - blocks.first);  // ci 1: one per block
    EXPECT_EQ(most, per_micro_step * size_t(std::min(pp - s, m)));
  }
}

TEST(Pipeline, ActivationsCrossTheNetworkWhereStagesAreOnDifferentNodes) {
  // two DGX-2 nodes, 16 GPUs per stage: each stage fills a node
  const Schedule s0 = make_stage("zero3", 2, 0, 2, dgx2_nodes(2));
  bool network = false;
  for (const Step& x : s0.steps)
    if (x.kind == StepKind::p2p) network = network || x.link == LinkClass::network;
  EXPECT_TRUE(network);
  EXPECT_EQ(s0.dp, 16);
  // one node, 8 GPUs per stage: NVSwitch
  const Schedule one = make_stage("zero3", 2, 0, 2, dgx2_nodes(1));
  for (const Step& x : one.steps)
    if (x.kind == StepKind::p2p) {
      EXPECT_EQ(x.link, LinkClass::gpu_gpu);
    }
}

// With tensor slicing each slice sends and receives 1/mp of a (B, T, C) activation (Megatron's
// scatter), and every receive is followed by the all-gather over the mp group that makes it whole,
// which the computes of the micro-step wait for (not the receive alone).
TEST(Pipeline, SlicesSendTheirPartAndAllGatherWhatTheyReceive) {
  const HardwareProfile p = dgx2_nodes();
  const ModelSpec m = stage_model();
  const int pp = 3, ga = 4, mp = 2;
  const double act = 2.0 * 2 * m.seq * m.hidden;  // fp16 (B, T, C), bsz 2
  for (int s = 0; s < pp; ++s) {
    SCOPED_TRACE("stage " + std::to_string(s));
    const Schedule st = make_stage("three_d", pp, s, ga, p, mp);
    int recvs = 0, gathers = 0, sends = 0;
    std::vector<int> dependents(st.steps.size(), 0);
    for (const Step& x : st.steps)
      for (int d : x.deps) dependents[size_t(d)]++;
    for (size_t i = 0; i < st.steps.size(); ++i) {
      const Step& x = st.steps[i];
      if (x.kind != StepKind::p2p) continue;
      if (x.hop == Hop::mp) {
        ++gathers;
        ASSERT_EQ(x.collective.kind, CollectiveKind::all_gather);
        EXPECT_EQ(x.collective.group, CommGroup::mp);
        EXPECT_EQ(x.collective.members, mp);
        EXPECT_DOUBLE_EQ(x.collective.bytes_per_rank, act / mp);
        EXPECT_DOUBLE_EQ(x.bytes, act * (mp - 1) / mp);  // the other slices' parts arrive
        ASSERT_EQ(x.deps.size(), 1u);
        const Step& r = st.steps[size_t(x.deps[0])];
        EXPECT_TRUE(r.kind == StepKind::p2p && r.hop == Hop::recv && r.phase == x.phase && r.block == x.block);
        // the receive's only dependent is its gather: nothing reads a part before it is whole
        EXPECT_EQ(dependents[size_t(x.deps[0])], 1);
        EXPECT_GT(dependents[i], 0);
      } else {
        EXPECT_DOUBLE_EQ(x.bytes, act / mp);
        (x.hop == Hop::recv ? recvs : sends)++;
      }
    }
    EXPECT_EQ(gathers, recvs);
    EXPECT_EQ(recvs, ga * ((s > 0) + (s < pp - 1)));
    EXPECT_EQ(sends, recvs);
    EXPECT_TRUE(check_invariants(st).empty());
  }
}

// A tied embedding has a copy on the first stage (the embedding's) and on the last (the LM head's).
// Each collects its gradient over every micro-step on the GPU and sums it with the other once its
// stage's backward is done (Megatron-LM's embedding all-reduce, CommGroup::tied), before the one
// reduce over dp: nothing of the stage's backward waits for it (it waits for the other stage's
// whole backward), and every update does. Middle stages and an untied head have none.
TEST(Pipeline, TheTiedEmbeddingsCopiesAreSummedOnceTheStagesBackwardIsDone) {
  const HardwareProfile p = dgx2_nodes();
  const int pp = 3, ga = 4;
  for (const char* name : {"zero3", "zero_inf_cpu", "zero_inf_nvme", "data_parallel"})
    for (bool tied : {true, false})
      for (int s = 0; s < pp; ++s) {
        SCOPED_TRACE(std::string(name) + (tied ? " tied" : " untied") + " stage " + std::to_string(s));
        ModelSpec m = stage_model();
        m.tied_embeddings = tied;
        Result<Schedule> r = build_schedule(m, *preset(name), stage_config(pp, ga, 1), p, 0, MemorySizes{}, s);
        ASSERT_TRUE(r.ok()) << r.error();
        const Schedule& st = *r;
        EXPECT_TRUE(check_invariants(st).empty());
        std::vector<const Step*> sums;
        for (const Step& x : st.steps)
          if (x.collective.group == CommGroup::tied) sums.push_back(&x);
        if (!tied || (s > 0 && s < pp - 1)) {
          EXPECT_TRUE(sums.empty());
          continue;
        }
        ASSERT_EQ(sums.size(), 1u);
        const Step& x = *sums[0];
        EXPECT_EQ(x.kind, StepKind::allreduce);
        EXPECT_EQ(x.collective.kind, CollectiveKind::all_reduce);
        EXPECT_EQ(x.collective.members, 2);
        EXPECT_EQ(x.link, LinkClass::gpu_gpu);
        EXPECT_EQ(x.accum_step, ga - 1);
        const double embed = 2.0 * double(m.vocab + m.seq) * double(m.hidden);  // fp16, tokens and positions
        EXPECT_DOUBLE_EQ(x.collective.bytes_per_rank, embed);
        // after every compute of the stage's backward, and issued after its sends and receives
        // (collectives are issued in schedule order): its partner waits for the whole of this
        // stage's backward, so nothing of it may wait for the sum
        std::set<int> before = {x.id};
        std::function<void(int)> walk = [&](int id) {
          for (int d : st.steps[size_t(id)].deps)
            if (before.insert(d).second) walk(d);
        };
        walk(x.id);
        for (const Step& y : st.steps) {
          if (y.phase == Phase::backward && y.kind == StepKind::compute) {
            EXPECT_TRUE(before.count(y.id)) << step_label(y) << " not before the sum";
          }
          if (y.phase == Phase::backward && y.kind == StepKind::p2p) {
            EXPECT_LT(y.id, x.id) << step_label(y);
          }
          if (y.kind == StepKind::optimizer) {
            std::set<int> up;
            std::function<void(int)> w2 = [&](int id) {
              for (int d : st.steps[size_t(id)].deps)
                if (up.insert(d).second) w2(d);
            };
            w2(y.id);
            EXPECT_TRUE(up.count(x.id)) << step_label(y) << " does not wait for the sum";
          }
        }
        // the embedding's gradient is reduced over dp once, after the sum (not per micro-step)
        int reduces = 0;
        for (const Step& y : st.steps)
          if (y.unit == x.unit && y.phase == Phase::backward && y.state == State::grad16 &&
              (y.kind == StepKind::reduce_scatter || y.kind == StepKind::allreduce) && y.collective.group == CommGroup::dp) {
            ++reduces;
            EXPECT_GT(y.id, x.id);
          }
        EXPECT_EQ(reduces, 1);
      }
}

TEST(Pipeline, BadStagesAreRefusedWithTheFlag) {
  const ModelSpec m = stage_model();
  const HardwareProfile p = dgx2_nodes();
  TrainingConfig c;
  c.seq = m.seq;
  c.pp = 7;  // more stages than the 6 blocks
  Result<Schedule> r = build_schedule(m, *preset("zero3"), c, p);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().rfind("--pp: ", 0), 0u) << r.error();
  c.pp = 2;
  r = build_schedule(m, *preset("zero3"), c, p, 0, MemorySizes{}, 2);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().rfind("--stage: expected 0..1", 0), 0u) << r.error();
  c.micro_batches = 4;
  r = build_schedule(m, *preset("l2l"), c, p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("--pp"), std::string::npos) << r.error();
  c = TrainingConfig{};
  c.seq = m.seq;
  c.pp = 4;
  c.dp = 8;  // 8 x 4 = 32 GPUs on 16
  r = build_schedule(m, *preset("zero3"), c, p);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().find("--dp/--mp/--pp: 8 x 1 x 4 GPUs asked"), std::string::npos) << r.error();
}

// Checkpoints partitioned across the tensor-slicing ranks (act_ckpt partitioned: DeepSpeed's
// partition_activations): each rank saves and loads 1/mp of a checkpoint and all-gathers the rest
// over the mp group before the segment's recompute, into a whole one.
TEST(Pipeline, PartitionedCheckpointsAreSlicedAndGatheredOverTheMpGroup) {
  const HardwareProfile p = dgx2_nodes();
  Placement sliced = *preset("three_d");
  sliced.act_ckpt = {Tier::cpu, true};
  Placement whole = sliced;
  whole.act_ckpt.partitioned = false;
  const TrainingConfig c = stage_config(2, 3, 4);
  const Schedule a = *build_schedule(stage_model(), sliced, c, p, 0, MemorySizes{}, 0);
  const Schedule b = *build_schedule(stage_model(), whole, c, p, 0, MemorySizes{}, 0);
  double saved_a = 0, saved_b = 0, gathered = 0, loads = 0, gathers = 0;
  for (const Step& x : a.steps) {
    if (x.kind == StepKind::save_ckpt) saved_a += x.bytes;
    if (x.kind == StepKind::load_ckpt) ++loads;
    if (x.kind == StepKind::fetch && x.hop == Hop::mp && x.state == State::act_ckpt) {
      ++gathers;
      gathered += x.bytes;
      EXPECT_EQ(x.link, LinkClass::gpu_gpu);
      EXPECT_EQ(a.steps[size_t(x.deps.at(0))].kind, StepKind::load_ckpt);
    }
  }
  for (const Step& x : b.steps) {
    if (x.kind == StepKind::save_ckpt) saved_b += x.bytes;
    EXPECT_FALSE(x.kind == StepKind::fetch && x.hop == Hop::mp);
  }
  EXPECT_GT(loads, 0);
  EXPECT_EQ(gathers, loads);
  EXPECT_DOUBLE_EQ(saved_a * 4, saved_b);      // 1/mp offloaded
  EXPECT_DOUBLE_EQ(gathered, saved_b - saved_a);  // the other 3/4 over the mp group
  EXPECT_LT(a.peak_bytes[int(Tier::cpu)], b.peak_bytes[int(Tier::cpu)]);
  // with mp 1 there is nothing to split
  Result<Schedule> one = build_schedule(stage_model(), sliced, stage_config(2, 3, 1), p);
  ASSERT_FALSE(one.ok());
  EXPECT_NE(one.error().find("act_ckpt: partitioned checkpoints"), std::string::npos) << one.error();
}

// Seed 004, DeepSpeed's 3D parallelism blog. (1) "In our trillion-parameter example with a
// micro-batch size of 1, our model would consume 30 GB of memory for model states and 2.5 GB for
// partitioned activations after activation checkpointing" (mp 8 x pp 64 x dp 8 on 4096 A100s; the
// blog's trillion-parameter model: 298 layers, hidden 17408, sequence 2048): the first stage's
// checkpoints of its 64 micro-batches in flight. (2) DeepSpeed trained that model on 800 V100s of
// 32 GB with mp 16 and pp 50: it fits with the checkpoints partitioned, not without.
TEST(Pipeline, DeepSpeedBlogsTrillionParameterThreeD) {
  const ModelSpec m = *model_from_shape(298, 17408, 128, 2048);
  Placement sliced = *preset("three_d");
  sliced.act_ckpt.partitioned = true;
  TrainingConfig c;
  c.seq = m.seq;
  c.bsz = 1;
  c.mp = 8;
  c.pp = 64;
  c.dp = 8;
  c.grad_accum = 8 * 64;  // "a gradient accumulation step of 8x the pipeline parallelism degree"
  const HardwareProfile a100 = *scale_to_nodes(*load_profile("dgx-a100"), 512);
  const MemoryModel mm = memory_model(m, sliced, c, a100);
  double ckpt = 0;
  for (const MemoryPart& part : mm.of(Tier::gpu).parts)
    if (part.what.starts_with("activation checkpoints on the GPU")) ckpt = part.bytes;
  std::printf("first stage's partitioned checkpoints: %.2f GB (the blog: 2.5 GB)\n", ckpt / 1e9);
  EXPECT_NEAR(ckpt / 2.5e9, 1.0, 0.15);

  const HardwareProfile v100 = *scale_to_nodes(*load_profile("dgx2"), 50);
  c.mp = 16;
  c.pp = 50;
  c.dp = 1;
  c.grad_accum = 2048;  // batch size 2048
  for (int stage : {0, 49}) {
    const MemoryModel with = memory_model(m, sliced, c, v100, 0, MemorySizes{}, stage);
    const MemoryModel without = memory_model(m, *preset("three_d"), c, v100, 0, MemorySizes{}, stage);
    std::printf("stage %d: %.1f GiB partitioned, %.1f GiB whole, of %.1f GiB\n", stage,
                with.of(Tier::gpu).peak_bytes / (1 << 30), without.of(Tier::gpu).peak_bytes / (1 << 30),
                with.of(Tier::gpu).capacity_bytes / (1 << 30));
    EXPECT_LE(with.of(Tier::gpu).peak_bytes, with.of(Tier::gpu).capacity_bytes) << stage;
    if (stage == 0) {
      EXPECT_GT(without.of(Tier::gpu).peak_bytes, without.of(Tier::gpu).capacity_bytes);
    }
  }
}

TEST(Pipeline, BubbleIsPMinusOneOverMPlusPMinusOne) {
  EXPECT_DOUBLE_EQ(pipeline_bubble(1, 8), 0);
  EXPECT_DOUBLE_EQ(pipeline_bubble(4, 12), 3.0 / 15.0);
  EXPECT_EQ(stage_blocks(10, 3, 0).first, 0);
  EXPECT_EQ(stage_blocks(10, 3, 2).last, 10);
  EXPECT_EQ(stage_blocks(10, 3, 1).first, stage_blocks(10, 3, 0).last);
}

}  // namespace
}  // namespace memwall
