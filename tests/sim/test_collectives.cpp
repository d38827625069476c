// Collectives against their closed forms on idle links: NCCL's ring all-gather and reduce-scatter
// take (n-1)/n · B/W + (n-1) · α, the ring all-reduce twice that, the pipelined broadcast and reduce
// B/W + (n-1) · α, where W is a member's NVSwitch bandwidth and α one step's latency (two links,
// kLinkLatency_s each). Each is replayed both ways the simulator does it (every member's flows, step by step;
// one member with stand-ins) on the platform built from the profile. Across nodes each step waits
// for the slower of its NVSwitch and NIC routes; the tree all-reduce wins only where latency rules.
#include <gtest/gtest.h>

#include <cmath>

#include "sim/platform.hpp"
#include "sim/replay.hpp"
#include "tests/sim/sim_test_support.hpp"

namespace memwall::sim {
namespace {

constexpr double W = 70e9;                  // dgx2: links.gpu_gpu
constexpr double kAlpha = 2 * kLinkLatency_s;  // nvlink up, nvlink down

using testing::dgx2;

CollectiveOp op(Collective kind, double bytes, int members, int per_node, int root = 0) {
  return {kind, bytes, {members, per_node}, root};
}

void expect_replays(const HardwareProfile& p, const CollectiveOp& o, double expected, bool symmetric_too = true) {
  Result<double> full = simulate_collective(p, o, true);
  ASSERT_TRUE(full.ok()) << full.error();
  EXPECT_NEAR(*full / expected, 1.0, 1e-6) << to_string(o.kind) << " n " << o.group.members << ": every member";
  if (!symmetric_too) return;
  Result<double> one = simulate_collective(p, o, false);
  ASSERT_TRUE(one.ok()) << one.error();
  EXPECT_NEAR(*one / expected, 1.0, 1e-6) << to_string(o.kind) << " n " << o.group.members << ": one member";
}

TEST(Collectives, RingAllGatherInANode) {
  for (int n : {2, 4, 8, 16}) {
    const double B = 1.6e9;
    const double expected = (n - 1.0) / n * B / W + (n - 1) * kAlpha;
    const CollectiveOp o = op(Collective::all_gather, B, n, n);
    EXPECT_DOUBLE_EQ(closed_form_s(o, Algorithm::ring, {W, kAlpha, 12e9, 4 * kLinkLatency_s}), expected);
    expect_replays(dgx2(), o, expected);
  }
}

TEST(Collectives, RingReduceScatterInANode) {
  for (int n : {2, 4, 16}) {
    const double B = 3.2e9;
    expect_replays(dgx2(), op(Collective::reduce_scatter, B, n, n), (n - 1.0) / n * B / W + (n - 1) * kAlpha);
  }
}

TEST(Collectives, RingAllReduceInANode) {
  for (int n : {2, 8, 16}) {
    const double B = 0.8e9;
    const CollectiveOp o = op(Collective::all_reduce, B, n, n);
    EXPECT_EQ(pick_algorithm(o, {W, kAlpha, 12e9, 4 * kLinkLatency_s}), Algorithm::ring);  // NCCL: ring in a node
    expect_replays(dgx2(), o, 2 * (n - 1.0) / n * B / W + 2 * (n - 1) * kAlpha);
  }
}

TEST(Collectives, PipelinedBroadcastAndReduceInANode) {
  for (int n : {2, 8, 16})
    for (int root : {0, n / 2}) {
      const double B = 0.7e9;
      const double expected = B / W + (n - 1) * kAlpha;
      // not symmetric (the root only sends): replayed with every member, as the broadcast variant is
      expect_replays(dgx2(), op(Collective::broadcast, B, n, n, root), expected, false);
      expect_replays(dgx2(), op(Collective::reduce, B, n, n, root), expected, false);
    }
}

// One member per node: every step crosses the NICs, at the GPU's PCIe link (12 GB/s; DGX-2's NICs
// sit on its PCIe switches) and with the NIC path at both ends on the route (four links).
TEST(Collectives, RingAcrossNodesOneMemberEach) {
  const double B = 1.2e9, alpha = 4 * kLinkLatency_s;
  for (int nodes : {2, 4}) {
    const double expected = (nodes - 1.0) / nodes * B / 12e9 + (nodes - 1) * alpha;
    expect_replays(dgx2(nodes), op(Collective::all_gather, B, nodes, 1), expected);
  }
}

// 16 members per node, 2 nodes: each step sends 15/16 of its chunk over NVSwitch and 1/16 through
// the NICs (one channel per member, each crossing once), the node's measured 82.5 GB/s shared by
// 16, and waits for the slower route (here NVSwitch) and the longer latency.
TEST(Collectives, RingAcrossNodesWaitsForTheSlowerRoute) {
  const double B = 3.2e9, n = 32, c = B / n;
  ASSERT_DOUBLE_EQ(dgx2(2).inter_node_Bps, 82.5e9);  // links.inter_node_measured, 660 Gbps
  const double nvswitch = 15.0 / 16 * c / W, nic = c / 16 / (82.5e9 / 16);
  expect_replays(dgx2(2), op(Collective::all_gather, B, 32, 16), (n - 1) * (std::max(nvswitch, nic) + 4 * kLinkLatency_s));
}

// A collective across nodes gets the profile's measured network (inter_node_Bps), never the line
// rate beside it: at 40 GB/s per node the same ring waits for the NICs.
TEST(Collectives, RingAcrossNodesAtTheMeasuredNetworkBandwidth) {
  const double B = 3.2e9, n = 32, c = B / n;
  HardwareProfile p = dgx2(2);
  ASSERT_DOUBLE_EQ(p.inter_node_nominal_Bps, 100e9);  // links.inter_node, 800 Gbps
  p.inter_node_Bps = 40e9;
  const double nvswitch = 15.0 / 16 * c / W, nic = c / 16 / (40e9 / 16);
  ASSERT_GT(nic, nvswitch);
  expect_replays(p, op(Collective::all_gather, B, 32, 16), (n - 1) * (nic + 4 * kLinkLatency_s));
}

TEST(Collectives, TreeAllReduceOnlyWhereLatencyRules) {
  const HardwareProfile p = dgx2(4);
  const PathRates r{W, kAlpha, 100e9 / 16, 4 * kLinkLatency_s};
  EXPECT_EQ(pick_algorithm(op(Collective::all_reduce, 64e3, 64, 16), r), Algorithm::tree);
  EXPECT_EQ(pick_algorithm(op(Collective::all_reduce, 1e9, 64, 16), r), Algorithm::ring);
  EXPECT_EQ(pick_algorithm(op(Collective::all_gather, 64e3, 64, 16), r), Algorithm::ring);  // NCCL: ring only
  // 2 nodes of 4: the chain moves 2 x 3/4 of B each way over NVSwitch, the trees 2 x 1/2 x B/4
  // per member through the NICs; all at once (pipelined), then the pipeline's depth in latencies.
  const CollectiveOp o = op(Collective::all_reduce, 2e6, 8, 4);
  const PathRates r2{W, kAlpha, std::min(12e9, 100e9 / 4), 4 * kLinkLatency_s};
  ASSERT_EQ(pick_algorithm(o, r2), Algorithm::tree);
  const double B = o.bytes;
  const double expected = std::max(1.5 * B / W, B / 4 / r2.inter_Bps) + 2 * (3 + 1) * r2.inter_latency_s;
  EXPECT_NEAR(closed_form_s(o, Algorithm::tree, r2) / expected, 1.0, 1e-12);
  expect_replays(dgx2(2), o, expected);
}

// A mixture of experts' token exchange (issue 27): every member sends B/n to every other at once,
// so its link carries (n-1)/n · B in each direction, then one route latency; across nodes the
// NIC route (shared by the node's members) and NVSwitch carry their shares at once.
TEST(Collectives, AllToAllSendsDirectlyToEveryMember) {
  for (int n : {2, 4, 8, 16}) {
    const double B = 1.6e9;
    const CollectiveOp o = op(Collective::all_to_all, B, n, n);
    const PathRates r{W, kAlpha, 12e9, 4 * kLinkLatency_s};
    EXPECT_EQ(pick_algorithm(o, r), Algorithm::direct);
    const double expected = (n - 1.0) / n * B / W + kAlpha;
    EXPECT_DOUBLE_EQ(closed_form_s(o, Algorithm::direct, r), expected);
    const MemberTraffic t = member_traffic(o, Algorithm::direct);
    EXPECT_DOUBLE_EQ(t.out_intra, (n - 1.0) / n * B);
    EXPECT_DOUBLE_EQ(t.in_intra, t.out_intra);
    const FlowPlan flows = member_flows(o, Algorithm::direct);
    ASSERT_EQ(flows.rounds.size(), 1u);
    EXPECT_EQ(flows.rounds[0].size(), size_t(n * (n - 1)));
    expect_replays(dgx2(), o, expected);
  }
  // one member per node: (n-1)/n of B through its node's NICs
  const double B = 1.2e9, alpha = 4 * kLinkLatency_s;
  for (int nodes : {2, 4})
    expect_replays(dgx2(nodes), op(Collective::all_to_all, B, nodes, 1), (nodes - 1.0) / nodes * B / 12e9 + alpha);
}

}  // namespace
}  // namespace memwall::sim
