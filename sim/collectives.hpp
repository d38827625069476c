// Collectives as NCCL runs them: ring all-gather, reduce-scatter and all-reduce; the tree
// all-reduce (a chain inside each node, a double binary tree between nodes) where NCCL's own cost
// model would pick it over the ring; broadcast and reduce pipelined along the ring; all-to-all as
// direct sends from every member to every other at once (NCCL's grouped send/recv). Describes the
// flows of one collective two ways: every member's flows, round by round (the full replay), and one
// member's flows merged over the rounds when every member is alike (the symmetric replay), plus
// the closed form of each on idle links, which the tests hold the replay to. Rings and trees use
// one channel per member of a node, rotated, so that every member carries the same share of the
// node's inter-node traffic (NCCL spreads its channels over the NICs the same way). Does not know
// SimGrid; pure functions over value types: thread-safe.
#pragma once

#include <string>
#include <vector>

namespace memwall::sim {

enum class Collective { all_gather, reduce_scatter, all_reduce, broadcast, reduce, all_to_all };
// pipeline: broadcast / reduce streamed along the ring; direct: all-to-all's pairwise sends
enum class Algorithm { ring, tree, pipeline, direct };
const char* to_string(Collective c);
const char* to_string(Algorithm a);

// The members of a collective: `members` GPUs, `per_node` of them in each node in member order
// (member x is on node x / per_node); the last node may hold fewer.
struct Group {
  int members = 1;
  int per_node = 1;
  int nodes() const { return (members + per_node - 1) / per_node; }
};

struct CollectiveOp {
  Collective kind = Collective::all_gather;
  double bytes = 0;  // B: the whole buffer (all-gather's output, reduce-scatter's input, all-to-all's
                     // send buffer of one member: B / n to each member)
  Group group;
  int root = 0;      // broadcast and reduce: the member that owns the buffer
};

// What one member's idle links give: to a member of its node (NVSwitch), to a member of another
// node (its NIC path; the node's NICs shared by `per_node` members), and each route's latency.
struct PathRates {
  double intra_Bps = 0, intra_latency_s = 0;
  double inter_Bps = 0, inter_latency_s = 0;
};

// Time on idle links, e.g. ring all-gather in one node: (n-1)/n · B/W + (n-1) · latency.
double closed_form_s(const CollectiveOp& op, Algorithm a, const PathRates& r);
// NCCL's choice: ring for everything but all-reduce across nodes, where the faster of ring and
// tree by closed_form_s wins.
Algorithm pick_algorithm(const CollectiveOp& op, const PathRates& r);

// One member's traffic over the whole collective, when every member is alike (the symmetric
// replay): bytes out and in over NVSwitch and over the NICs, bytes of reduction work through HBM
// (reading two inputs and writing one per reduced byte), and how many route latencies it waits
// for in sequence (ring: one per step; pipelined: the depth of the pipeline).
struct MemberTraffic {
  double out_intra = 0, in_intra = 0, out_inter = 0, in_inter = 0;
  double reduce_bytes = 0;
  int latencies = 0;
};
MemberTraffic member_traffic(const CollectiveOp& op, Algorithm a);

// Every member's flows (the full replay): rounds run in order, a member's flows of round r + 1
// waiting for its own incoming flows of round r; flows between the same two members in a round
// are one flow. Ring: one round per step. Tree and pipeline: one round of concurrent flows (the
// pipeline streams), then `extra_latencies` more route latencies to fill it. Reduction work is
// member_traffic's, on every member.
struct Flow {
  int from = 0, to = 0;
  double bytes = 0;
};
struct FlowPlan {
  std::vector<std::vector<Flow>> rounds;
  int extra_latencies = 0;
};
FlowPlan member_flows(const CollectiveOp& op, Algorithm a);

}  // namespace memwall::sim
