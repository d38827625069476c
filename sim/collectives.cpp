#include "sim/collectives.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

namespace memwall::sim {

const char* to_string(Collective c) {
  switch (c) {
    case Collective::all_gather: return "all_gather";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::all_reduce: return "all_reduce";
    case Collective::broadcast: return "broadcast";
    case Collective::reduce: return "reduce";
    case Collective::all_to_all: return "all_to_all";
  }
  return "?";
}
const char* to_string(Algorithm a) {
  switch (a) {
    case Algorithm::ring: return "ring";
    case Algorithm::tree: return "tree";
    case Algorithm::pipeline: return "pipeline";
    case Algorithm::direct: return "direct";
  }
  return "?";
}

namespace {

// Key: n members, k per node, N nodes, c = B / n, W and α the idle rates and latencies.
struct Shape {
  int n, k, N;
  explicit Shape(const Group& g) : n(std::max(1, g.members)), k(std::clamp(g.per_node, 1, n)), N(g.nodes()) {}
};

int ceil_log2(int x) {
  int l = 0;
  while ((1 << l) < x) ++l;
  return l;
}

// Bytes one member moves to members of its node and of other nodes when it passes on `chunk`
// bytes along the rings: one channel per member of a node, each crossing to the next node once.
std::pair<double, double> ring_split(const Shape& s, double chunk) {
  if (s.N == 1) return {chunk, 0};
  return {chunk * (s.k - 1) / s.k, chunk / s.k};
}

int ring_rounds(const CollectiveOp& op, const Shape& s) {
  return op.kind == Collective::all_reduce ? 2 * (s.n - 1) : s.n - 1;
}

// The latency one step waits for: its slowest route's.
double step_latency(double intra, double inter, const PathRates& r) {
  return std::max(intra > 0 ? r.intra_latency_s : 0.0, inter > 0 ? r.inter_latency_s : 0.0);
}

// Bytes over the two routes on idle links, at once.
double transfer_s(double intra, double inter, const PathRates& r) {
  return std::max(intra > 0 ? intra / r.intra_Bps : 0.0, inter > 0 ? inter / r.inter_Bps : 0.0);
}

}  // namespace

MemberTraffic member_traffic(const CollectiveOp& op, Algorithm a) {
  const Shape s(op.group);
  MemberTraffic t;
  if (s.n <= 1 || op.bytes <= 0) return t;
  const double B = op.bytes, c = B / s.n;
  switch (a) {
    case Algorithm::ring: {
      const int rounds = ring_rounds(op, s);
      auto [intra, inter] = ring_split(s, c);
      t.out_intra = t.in_intra = rounds * intra;
      t.out_inter = t.in_inter = rounds * inter;
      if (op.kind != Collective::all_gather) t.reduce_bytes = 3 * (s.n - 1) * c;
      t.latencies = rounds;
      return t;
    }
    case Algorithm::tree: {
      t.out_intra = t.in_intra = 2 * B * (s.k - 1) / s.k;
      t.out_inter = t.in_inter = s.N > 1 ? 2 * B * (s.N - 1) / (double(s.N) * s.k) : 0;
      t.reduce_bytes = 3 * (t.in_intra + t.in_inter) / 2;
      t.latencies = 2 * ((s.k - 1) + ceil_log2(s.N));
      return t;
    }
    case Algorithm::direct: {
      // B / n to each other member at once: k - 1 of them in its node, the rest over its NIC path
      t.out_intra = t.in_intra = c * (s.k - 1);
      t.out_inter = t.in_inter = c * (s.n - s.k);
      t.latencies = 1;
      return t;
    }
    case Algorithm::pipeline: {
      // A member inside the chain: B streams in and out (the root only sends, the ends only receive).
      auto [intra, inter] = ring_split(s, B);
      t.out_intra = t.in_intra = intra;
      t.out_inter = t.in_inter = inter;
      if (op.kind == Collective::reduce) t.reduce_bytes = 3 * (intra + inter);
      t.latencies = s.n - 1;
      return t;
    }
  }
  return t;
}

double closed_form_s(const CollectiveOp& op, Algorithm a, const PathRates& r) {
  const Shape s(op.group);
  if (s.n <= 1 || op.bytes <= 0) return 0;
  const MemberTraffic t = member_traffic(op, a);
  // Ring: every step moves one chunk per member, then waits for its route. Pipelined (tree,
  // broadcast, reduce): the bytes stream through every member at once, and the pipeline fills
  // one route latency per hop of its depth.
  return transfer_s(t.out_intra, t.out_inter, r) + t.latencies * step_latency(t.out_intra, t.out_inter, r);
}

Algorithm pick_algorithm(const CollectiveOp& op, const PathRates& r) {
  if (op.kind == Collective::all_to_all) return Algorithm::direct;
  if (op.kind == Collective::broadcast || op.kind == Collective::reduce) return Algorithm::pipeline;
  if (op.kind != Collective::all_reduce || op.group.nodes() <= 1) return Algorithm::ring;
  return closed_form_s(op, Algorithm::tree, r) < closed_form_s(op, Algorithm::ring, r) ? Algorithm::tree
                                                                                        : Algorithm::ring;
}

namespace {

// Members of node `a`: [a * k, a * k + size(a)).
struct NodeGroups {
  const Shape& s;
  int size(int a) const { return std::min(s.k, s.n - a * s.k); }
  int member(int a, int j) const { return a * s.k + j; }
};

// Accumulates flows per (from, to) pair, keeping the order in which pairs first appear.
class Round {
 public:
  void add(int from, int to, double bytes) {
    if (bytes <= 0 || from == to) return;
    auto [it, fresh] = index_.try_emplace({from, to}, flows_.size());
    if (fresh) flows_.push_back({from, to, 0});
    flows_[it->second].bytes += bytes;
  }
  std::vector<Flow> take() { return std::move(flows_); }

 private:
  std::map<std::pair<int, int>, size_t> index_;
  std::vector<Flow> flows_;
};

// One ring step: every member passes `chunk` bytes on, split over the channels as ring_split says.
// `skip_into` (>= 0): no flow enters that member (a pipeline's root).
void ring_step(const Shape& s, double chunk, int skip_into, Round& r) {
  const NodeGroups L{s};
  for (int a = 0; a < s.N; ++a) {
    const int ka = L.size(a);
    for (int j = 0; j < ka; ++j) {
      const int x = L.member(a, j);
      if (s.N == 1) {
        const int to = L.member(a, (j + 1) % ka);
        if (to != skip_into) r.add(x, to, chunk);
        continue;
      }
      const int intra = L.member(a, (j + 1) % ka);
      const int b = (a + 1) % s.N;
      const int inter = L.member(b, (j + 1) % L.size(b));
      if (ka > 1 && intra != skip_into) r.add(x, intra, chunk * (ka - 1) / ka);
      if (inter != skip_into) r.add(x, inter, chunk / ka);
    }
  }
}

}  // namespace

FlowPlan member_flows(const CollectiveOp& op, Algorithm a) {
  const Shape s(op.group);
  FlowPlan plan;
  if (s.n <= 1 || op.bytes <= 0) return plan;
  const double B = op.bytes;
  switch (a) {
    case Algorithm::ring: {
      const int rounds = ring_rounds(op, s);
      for (int step = 0; step < rounds; ++step) {
        Round r;
        ring_step(s, B / s.n, -1, r);
        plan.rounds.push_back(r.take());
      }
      return plan;
    }
    case Algorithm::direct: {
      Round r;
      for (int x = 0; x < s.n; ++x)
        for (int y = 0; y < s.n; ++y) r.add(x, y, B / s.n);  // add() skips x == y
      plan.rounds.push_back(r.take());
      return plan;
    }
    case Algorithm::pipeline: {
      Round r;
      ring_step(s, B, op.root, r);
      std::vector<Flow> flows = r.take();
      if (op.kind == Collective::reduce)  // the same stream, toward the root
        for (Flow& f : flows) std::swap(f.from, f.to);
      plan.rounds.push_back(std::move(flows));
      plan.extra_latencies = s.n - 2;
      return plan;
    }
    case Algorithm::tree: {
      const NodeGroups L{s};
      Round r;
      // The chain inside each node, one channel per member as head: reduce toward the head
      // (member j to j - 1), broadcast away from it (j to j + 1), (k - 1) / k of B each way.
      for (int n = 0; n < s.N; ++n) {
        const int kn = L.size(n);
        for (int j = 0; j < kn && kn > 1; ++j) {
          const double share = B * (kn - 1) / kn;
          r.add(L.member(n, j), L.member(n, (j + kn - 1) % kn), share);
          r.add(L.member(n, j), L.member(n, (j + 1) % kn), share);
        }
      }
      // Between nodes, each channel's heads (member j of every node, for channel j) form two
      // binary trees (heap order, and the mirrored order), each carrying half of the channel.
      if (s.N > 1)
        for (int ch = 0; ch < s.k; ++ch)
          for (int tree = 0; tree < 2; ++tree)
            for (int pos = 1; pos < s.N; ++pos) {
              const int child = tree == 0 ? pos : s.N - 1 - pos;
              const int parent = tree == 0 ? (pos - 1) / 2 : s.N - 1 - (pos - 1) / 2;
              const int hc = L.member(child, ch % L.size(child)), hp = L.member(parent, ch % L.size(parent));
              const double half = B / (2.0 * s.k);
              r.add(hc, hp, half);  // reduce up
              r.add(hp, hc, half);  // broadcast down
            }
      plan.rounds.push_back(r.take());
      plan.extra_latencies = std::max(0, 2 * ((s.k - 1) + ceil_log2(s.N)) - 1);
      return plan;
    }
  }
  return plan;
}

}  // namespace memwall::sim
