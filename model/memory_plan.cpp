#include "model/memory_plan.hpp"

#include <algorithm>
#include <cmath>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <unordered_set>

#include "model/units.hpp"

namespace memwall {
namespace {

// The most buffers of one tier placed greedily by size (and spread to keep reuse far apart); more
// are placed in time order by first fit (fit_in_time_order). About 400 layers of a paper GPT.
constexpr size_t kGreedyBuffers = 20000;

std::uint64_t align_up(std::uint64_t n, std::uint64_t a) { return a <= 1 ? n : (n + a - 1) / a * a; }

std::uint64_t tier_align(const Schedule& s, Tier t) {
  const double a = t == Tier::gpu ? s.sizes.device_align_bytes : s.sizes.host_align_bytes;
  return std::uint64_t(std::max(1.0, a));
}

// Every step that names a buffer: made_at, src_buf, dst_buf, uses (the reuse edges go to each).
std::vector<std::vector<int>> users_of(const Schedule& s) {
  std::vector<std::vector<int>> out(s.buffers.size());
  auto add = [&](int b, int step) {
    if (b < 0 || size_t(b) >= out.size()) return;
    std::vector<int>& v = out[size_t(b)];
    if (v.empty() || v.back() != step) v.push_back(step);
  };
  for (const Step& st : s.steps) {
    for (int b : st.allocs) add(b, st.id);
    add(st.src_buf, st.id);
    add(st.dst_buf, st.id);
    for (int b : st.uses) add(b, st.id);
  }
  return out;
}

// Offsets for the buffers of one tier, knowing every lifetime [made_at, freed_at] (two buffers
// alive at one step never share bytes): largest first, each at the lowest offset clear of every
// buffer already placed whose lifetime overlaps its own (the greedy-by-size assignment of TFLite's
// and ggml's allocators; within a few percent of the live peak). Returns the arena's size.
// Buffers alive for the whole iteration come first, at the bottom. With a reuse `distance` > 0 a
// lifetime counts from `distance` steps before the buffer is made: no buffer takes bytes given back
// fewer steps before it, so it seldom waits for them (a larger arena buys fewer waits).
bool whole_life(const Schedule& s, const Buffer& b) {
  return b.made_at == 0 && b.freed_at == int(s.steps.size()) - 1;
}

std::uint64_t pack_offsets(Schedule& s, const std::vector<int>& ids, int distance) {
  std::vector<int> order = ids;
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    const Buffer &x = s.buffers[size_t(a)], &y = s.buffers[size_t(b)];
    // buffers alive the whole iteration (an executor's workspace) at the bottom, in id order
    if (whole_life(s, x) != whole_life(s, y)) return whole_life(s, x);
    if (whole_life(s, x)) return a < b;
    if (x.arena_bytes != y.arena_bytes) return x.arena_bytes > y.arena_bytes;
    return x.made_at != y.made_at ? x.made_at < y.made_at : a < b;
  });
  // The buffers placed so far, in two lists by made_at: those alive longer than `span` steps, all
  // looked at for each new buffer, and the short-lived ones, of which only those made at most
  // span + distance steps before the new one starts can overlap it (a 1T plan's thousands of
  // buffers were each compared with every one placed before: a fifth of `memwall plan`'s time).
  // Which buffers overlap does not depend on the split, so neither do the offsets.
  const int span = std::max(64, int(s.steps.size()) / 64);
  std::vector<int> placed_long, placed_short;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> taken;
  std::uint64_t extent = 0;
  auto by_made = [&](int x, int y) { return s.buffers[size_t(x)].made_at < s.buffers[size_t(y)].made_at; };
  for (int id : order) {
    Buffer& b = s.buffers[size_t(id)];
    taken.clear();
    auto overlapping = [&](auto from, auto to) {  // lifetimes [made_at - distance, freed_at] that overlap
      for (auto it = from; it != to; ++it) {
        const Buffer& p = s.buffers[size_t(*it)];
        if (long(p.made_at) - distance > long(b.freed_at)) break;
        if (long(p.freed_at) >= long(b.made_at) - distance) taken.push_back({p.offset, p.offset + p.arena_bytes});
      }
    };
    overlapping(placed_long.begin(), placed_long.end());
    const long earliest = long(b.made_at) - distance - span;  // a short one made before it is freed before b
    overlapping(std::partition_point(placed_short.begin(), placed_short.end(),
                                     [&](int q) { return long(s.buffers[size_t(q)].made_at) < earliest; }),
                placed_short.end());
    std::sort(taken.begin(), taken.end());
    std::uint64_t at = 0;
    for (const auto& [from, to] : taken) {
      if (at + b.arena_bytes <= from) break;
      at = std::max(at, to);
    }
    b.offset = at;
    extent = std::max(extent, at + b.arena_bytes);
    std::vector<int>& list = b.freed_at - b.made_at > span ? placed_long : placed_short;
    list.insert(std::upper_bound(list.begin(), list.end(), id, by_made), id);
  }
  return extent;
}

// The dependencies the offsets need: walking the steps in order, a buffer made on bytes that
// another gave back waits, at every step that uses it, for the step that gave them back, unless
// it already does through one of its direct dependencies.
class Reuse {
 public:
  // The steps that last gave back bytes of [at, at + n), which the new buffer now takes.
  void take(std::uint64_t at, std::uint64_t n, std::vector<int>& after) {
    const std::uint64_t end = at + n;
    auto it = last_.upper_bound(at);
    if (it != last_.begin() && std::prev(it)->second.first > at) --it;
    while (it != last_.end() && it->first < end) {
      const auto [b, info] = *it;
      const auto [e, step] = info;
      after.push_back(step);
      it = last_.erase(it);
      if (b < at) last_[b] = {at, step};  // the parts outside [at, end) keep their last user
      if (e > end) last_[end] = {e, step};
    }
  }
  void give_back(std::uint64_t at, std::uint64_t n, int step) {
    if (n > 0) last_[at] = {at + n, step};
  }
  // The newest step that gave back any byte of [at, at + n): -1 for bytes never used.
  int latest(std::uint64_t at, std::uint64_t n) const {
    int out = -1;
    auto it = last_.upper_bound(at);
    if (it != last_.begin() && std::prev(it)->second.first > at) --it;
    for (; it != last_.end() && it->first < at + n; ++it) out = std::max(out, it->second.second);
    return out;
  }

 private:
  std::map<std::uint64_t, std::pair<std::uint64_t, int>> last_;  // offset -> (end, step that gave it back)
};

// The time-ordered packers' start: buffers alive the whole iteration at the bottom, in id order
// (their offsets set here); the others listed by the step that makes and the one that frees them.
struct ByStep {
  std::uint64_t bottom = 0;  // bytes of the whole-iteration buffers
  std::vector<std::vector<int>> made, given;
};

ByStep by_step(Schedule& s, const std::vector<int>& ids) {
  ByStep out{0, std::vector<std::vector<int>>(s.steps.size()), std::vector<std::vector<int>>(s.steps.size())};
  for (int id : ids) {
    Buffer& b = s.buffers[size_t(id)];
    if (whole_life(s, b)) {
      b.offset = out.bottom;
      out.bottom += b.arena_bytes;
    } else {
      out.made[size_t(b.made_at)].push_back(id);
      out.given[size_t(b.freed_at)].push_back(id);
    }
  }
  return out;
}

// Returns [at, at + n) to a map of free ranges (offset -> length), merged with its neighbours.
void give_back_range(std::map<std::uint64_t, std::uint64_t>& free, std::uint64_t at, std::uint64_t n) {
  if (n == 0) return;
  auto it = free.emplace(at, n).first;
  if (auto next = std::next(it); next != free.end() && it->first + it->second == next->first) {
    it->second += next->second;
    free.erase(next);
  }
  if (it != free.begin())
    if (auto prev = std::prev(it); prev->first + prev->second == it->first) {
      prev->second += it->second;
      free.erase(it);
    }
}

// Offsets within `limit` bytes for the buffers of one tier, in time order: the whole-iteration
// buffers at the bottom, then each buffer, as the steps make it, in the free range whose bytes
// were given back longest ago (never-used bytes first), so that a buffer seldom waits for one
// given back just before it. Returns the arena's size, or 0 when some buffer finds no free range.
std::uint64_t spread_offsets(Schedule& s, const std::vector<int>& ids, std::uint64_t limit) {
  std::map<std::uint64_t, std::uint64_t> free;  // offset -> length
  auto [bottom, made, given] = by_step(s, ids);
  if (bottom > limit) return 0;
  if (limit > bottom) free[bottom] = limit - bottom;
  std::uint64_t extent = bottom;
  Reuse last;
  for (size_t i = 0; i < s.steps.size(); ++i) {
    for (int id : made[i]) {
      Buffer& b = s.buffers[size_t(id)];
      bool found = false;
      int best_tag = 0;
      std::uint64_t best_len = 0, at = 0;
      for (const auto& [off, len] : free) {
        if (len < b.arena_bytes) continue;
        for (std::uint64_t cand : {off, off + len - b.arena_bytes}) {
          const int tag = last.latest(cand, b.arena_bytes);
          if (!found || tag < best_tag || (tag == best_tag && len < best_len)) {
            found = true;
            best_tag = tag;
            best_len = len;
            at = cand;
          }
        }
      }
      if (!found) return 0;
      auto it = std::prev(free.upper_bound(at));
      const std::uint64_t off = it->first, len = it->second;
      free.erase(it);
      if (at > off) free[off] = at - off;
      if (off + len > at + b.arena_bytes) free[at + b.arena_bytes] = off + len - (at + b.arena_bytes);
      b.offset = at;
      extent = std::max(extent, at + b.arena_bytes);
      std::vector<int> unused;
      last.take(at, b.arena_bytes, unused);
    }
    for (int id : given[i]) {
      const Buffer& b = s.buffers[size_t(id)];
      last.give_back(b.offset, b.arena_bytes, int(i));
      give_back_range(free, b.offset, b.arena_bytes);
    }
  }
  return extent;
}

// Offsets in time order, first fit: walking the steps, each buffer takes the lowest free range
// that holds it (or the top of the arena), and gives it back when freed; neighbours merge. Linear
// in buffers times the free ranges (a handful: the schedule's buffers come and go mostly as a
// stack, checkpoints freed in reverse order), where greedy by size costs the buffers times those
// alive beside each, which grows with the square of the layers (an activation overlaps every
// checkpoint alive) and took 490 s for an 8000-layer schedule. Arena against the live peak: equal
// at 4000 layers of hidden 1K; 6.6 % above it for table1-1T (greedy: equal), 19 % for table1-10B's
// gpu tier. With a reuse `distance`, bytes given back are free again `distance` steps later only.
// Returns the arena's size.
std::uint64_t fit_in_time_order(Schedule& s, const std::vector<int>& ids, int distance) {
  auto [top, made, given] = by_step(s, ids);
  std::map<std::uint64_t, std::uint64_t> free;  // free ranges below the top: offset -> length
  std::deque<std::pair<size_t, int>> resting;    // (step, buffer) given back, free `distance` steps later
  std::uint64_t extent = top;
  for (size_t i = 0; i < s.steps.size(); ++i) {
    for (; !resting.empty() && resting.front().first + size_t(distance) <= i; resting.pop_front()) {
      const Buffer& b = s.buffers[size_t(resting.front().second)];
      give_back_range(free, b.offset, b.arena_bytes);
    }
    for (int id : made[i]) {
      Buffer& b = s.buffers[size_t(id)];
      auto fit = std::find_if(free.begin(), free.end(), [&](const auto& r) { return r.second >= b.arena_bytes; });
      if (fit != free.end()) {
        const auto [off, len] = *fit;
        free.erase(fit);
        b.offset = off;
        if (len > b.arena_bytes) free[off + b.arena_bytes] = len - b.arena_bytes;
      } else if (!free.empty() && std::prev(free.end())->first + std::prev(free.end())->second == top) {
        b.offset = std::prev(free.end())->first;  // the free range under the top, grown
        free.erase(std::prev(free.end()));
        top = b.offset + b.arena_bytes;
      } else {
        b.offset = top;
        top += b.arena_bytes;
      }
      extent = std::max(extent, top);
    }
    for (int id : given[i]) resting.push_back({i, id});
  }
  return extent;
}

// Whether `step` waits for `on` directly or through one of its direct dependencies. A step with
// more than kScannedDeps dependencies (an optimizer chunk's fetch reuses the bytes of thousands of
// buffers, one edge each) is checked for a direct edge only, through `direct` (its deps as a set):
// scanning two levels of such lists made the plan cubic in layers (92 s at 8000 layers). Unsure
// means an edge that is redundant, never a missing one.
constexpr size_t kScannedDeps = 64;

bool depends_on(const Schedule& s, int step, int on, const std::unordered_set<int>* direct) {
  const std::vector<int>& d = s.steps[size_t(step)].deps;
  if (direct) return direct->count(on) > 0;
  if (std::find(d.begin(), d.end(), on) != d.end()) return true;
  for (int x : d) {
    const std::vector<int>& dd = s.steps[size_t(x)].deps;
    if (dd.size() <= kScannedDeps && std::find(dd.begin(), dd.end(), on) != dd.end()) return true;
  }
  return false;
}

std::string overflow_message(const Schedule& s, Tier t, int step, double needed, double cap, const std::string& why) {
  std::string where = "before the first step (persistent states)";
  if (step >= 0) {
    const Step& st = s.steps[size_t(step)];
    where = "at step " + std::to_string(step) + " (" + to_string(st.kind) + " " + st.name + ")";
  }
  const std::string stage =
      s.pp > 1 ? " (pipeline stage " + std::to_string(s.stage) + " of " + std::to_string(s.pp) + ")" : "";
  return std::string("out of memory on ") + to_string(t) + stage + " " + where + ": needs " + format_bytes(needed) +
         ", capacity " + format_bytes(cap) + " per rank" + why;
}

}  // namespace

std::vector<double> buffer_bytes_by_step(const Schedule& s, Tier tier) {
  std::vector<double> out;
  out.reserve(s.steps.size());
  double now = 0;
  walk_buffers(
      s, [&](const Step&, int b) { if (s.buffers[size_t(b)].tier == tier) now += s.buffers[size_t(b)].bytes; },
      [&](const Step&) { out.push_back(now); },
      [&](const Step&, int b) { if (s.buffers[size_t(b)].tier == tier) now -= s.buffers[size_t(b)].bytes; });
  return out;
}

PlanLimits plan_limits(const Schedule& s, double pinned_per_rank_bytes) {
  PlanLimits l;
  for (int t = 0; t < kTiers; ++t) {
    double persistent = 0;  // each state as an executor lays it out: rounded to the tier's alignment
    for (double b : s.persistent_bytes[size_t(t)])
      if (b > 0) persistent += double(align_up(std::uint64_t(std::ceil(b)), tier_align(s, Tier(t))));
    l.hard_bytes[size_t(t)] = std::max(0.0, s.capacity_bytes[size_t(t)] - persistent);
    l.room_bytes[size_t(t)] = l.hard_bytes[size_t(t)];
  }
  l.room_bytes[size_t(Tier::cpu)] = std::min(l.room_bytes[size_t(Tier::cpu)], pinned_per_rank_bytes);
  return l;
}

namespace {

// The walk: each buffer's lifetime and size as laid out, the schedule's peaks (persistent states
// plus live buffers) and the first tier the live bytes overflow. Returns the live peaks as laid out.
std::array<double, kTiers> lifetimes_and_peaks(Schedule& s, const std::function<void(Tier, double, int)>& check) {
  double chunk_slot = 0;  // chunk buffers are equal slots: the largest chunk's layout
  for (const ScheduleChunk& c : s.optimizer_chunks) chunk_slot = std::max(chunk_slot, c.layout_bytes);
  std::array<double, kTiers> resident{}, laid_out{}, laid_out_peak{};
  for (int t = 0; t < kTiers; ++t)
    for (double b : s.persistent_bytes[size_t(t)]) resident[size_t(t)] += b;
  for (int t = 0; t < kTiers; ++t) check(Tier(t), resident[size_t(t)], -1);
  s.peak_bytes = resident;
  walk_buffers(
      s,
      [&](const Step& st, int b) {
        Buffer& buf = s.buffers[size_t(b)];
        buf.made_at = st.id;
        const double laid = buf.kind == BufferKind::chunk ? std::max(chunk_slot, buf.bytes) : buf.bytes;
        buf.arena_bytes = align_up(std::uint64_t(std::ceil(std::max(0.0, laid))), tier_align(s, buf.tier));
        resident[size_t(buf.tier)] += buf.bytes;
        laid_out[size_t(buf.tier)] += double(buf.arena_bytes);
      },
      [&](const Step& st) {
        for (int t = 0; t < kTiers; ++t) {
          s.peak_bytes[size_t(t)] = std::max(s.peak_bytes[size_t(t)], resident[size_t(t)]);
          laid_out_peak[size_t(t)] = std::max(laid_out_peak[size_t(t)], laid_out[size_t(t)]);
          check(Tier(t), resident[size_t(t)], st.id);
        }
      },
      [&](const Step& st, int b) {
        const Buffer& buf = s.buffers[size_t(b)];
        s.buffers[size_t(b)].freed_at = st.id;
        resident[size_t(buf.tier)] -= buf.bytes;
        laid_out[size_t(buf.tier)] -= double(buf.arena_bytes);
      });
  return laid_out_peak;
}

// One tier's offsets. Past kGreedyBuffers buffers, first fit in time order (the greedy packings
// below cost the square of the layers), with a reuse distance of 8 or 2 steps where that fits in
// the room. Otherwise packed; with room to spare (up to twice the live peak), buffers in time
// order on the bytes given back longest ago, failing that the longer of two reuse distances that
// fits, failing that packed. A buffer reusing bytes given back long before seldom waits for them.
std::uint64_t place_tier(Schedule& s, Tier t, const std::vector<int>& ids, double live_peak, double room) {
  const std::uint64_t a = tier_align(s, t);
  const std::uint64_t limit = std::uint64_t(std::min(2.0 * live_peak, room)) / a * a;
  if (ids.size() > kGreedyBuffers) {
    // First fit too keeps reuse a few steps apart where there is room: a buffer on the bytes the
    // one before it just gave back waits for that one's last user, so that a tiled backward's next
    // tile waited for the previous tile's reduce-scatter (table1-10B zero3 bsz 2 tiling 32: 3.64 s
    // replayed, 2.99 s with the distance, where its computes take 2.90 s)
    if (double(limit) > live_peak)  // no arena is smaller than the live peak: else no room to try
      for (int distance : {8, 2})
        if (const std::uint64_t got = fit_in_time_order(s, ids, distance); got <= limit) return got;
    return fit_in_time_order(s, ids, 0);
  }
  const std::uint64_t packed = pack_offsets(s, ids, 0);
  if (limit <= packed || ids.empty()) return packed;
  std::uint64_t got = spread_offsets(s, ids, limit);
  for (int distance : {8, 2}) {
    if (got > 0 && got <= limit) break;
    got = pack_offsets(s, ids, distance);
  }
  return got > 0 && got <= limit ? got : pack_offsets(s, ids, 0);
}

// Walking the steps, a buffer made on bytes another gave back waits, at every step that uses it,
// for the step that gave them back, unless a direct dependency already does.
void add_reuse_edges(Schedule& s) {
  const std::vector<std::vector<int>> users = users_of(s);
  std::array<Reuse, kTiers> reuse;
  // A step's deps as a set, once they outgrow kScannedDeps; kept across buffers (a step using
  // thousands of buffers rebuilt it for each: quadratic).
  std::vector<std::unique_ptr<std::unordered_set<int>>> direct_of(s.steps.size());
  s.memory_edges = 0;
  walk_buffers(
      s,
      [&](const Step&, int b) {
        const Buffer& buf = s.buffers[size_t(b)];
        if (buf.arena_bytes == 0) return;
        std::vector<int> after;
        reuse[size_t(buf.tier)].take(buf.offset, buf.arena_bytes, after);
        std::sort(after.begin(), after.end());
        after.erase(std::unique(after.begin(), after.end()), after.end());
        if (after.empty()) return;
        for (int u : users[size_t(b)]) {  // in step order: a later user reached through an earlier one is covered
          std::vector<int>& deps = s.steps[size_t(u)].deps;
          std::unique_ptr<std::unordered_set<int>>& direct = direct_of[size_t(u)];
          for (int f : after) {
            if (!direct && deps.size() > kScannedDeps)
              direct = std::make_unique<std::unordered_set<int>>(deps.begin(), deps.end());
            if (f < u && !depends_on(s, u, f, direct.get())) {
              deps.push_back(f);
              if (direct) direct->insert(f);
              ++s.memory_edges;
            }
          }
        }
      },
      [](const Step&) {},
      [&](const Step& st, int b) {
        const Buffer& buf = s.buffers[size_t(b)];
        reuse[size_t(buf.tier)].give_back(buf.offset, buf.arena_bytes, st.id);
      });
}

}  // namespace

void plan_memory(Schedule& s, const PlanLimits& limits) {
  s.overflow.reset();
  auto check = [&](Tier t, double needed, int step, const std::string& why = "") {
    const double cap = s.capacity_bytes[size_t(t)];
    if (s.overflow || needed <= cap * (1 + 1e-12)) return;
    s.overflow = Overflow{t, step, needed, cap, overflow_message(s, t, step, needed, cap, why)};
  };
  const std::array<double, kTiers> live_peak =
      lifetimes_and_peaks(s, [&](Tier t, double needed, int step) { check(t, needed, step); });
  std::array<std::vector<int>, kTiers> of_tier;
  for (size_t b = 0; b < s.buffers.size(); ++b)
    if (s.buffers[b].arena_bytes > 0 && s.buffers[b].made_at >= 0 && s.buffers[b].freed_at >= 0)
      of_tier[size_t(s.buffers[b].tier)].push_back(int(b));
  for (int t = 0; t < kTiers; ++t) {
    const std::vector<int>& ids = of_tier[size_t(t)];
    s.arena_bytes[size_t(t)] = place_tier(s, Tier(t), ids, live_peak[size_t(t)], limits.room_bytes[size_t(t)]);
    const double hard = limits.hard_bytes[size_t(t)];
    if (double(s.arena_bytes[size_t(t)]) <= hard * (1 + 1e-12)) continue;
    int first = -1;  // the first step at which a buffer reaches past the capacity
    for (int b : ids)
      if (double(s.buffers[size_t(b)].offset + s.buffers[size_t(b)].arena_bytes) > hard * (1 + 1e-12) &&
          (first < 0 || s.buffers[size_t(b)].made_at < first))
        first = s.buffers[size_t(b)].made_at;
    check(Tier(t), s.capacity_bytes[size_t(t)] + double(s.arena_bytes[size_t(t)]) - hard, first,
          " (the memory plan: its buffers, placed so that none moves, need " +
              format_bytes(double(s.arena_bytes[size_t(t)])) + " beside the persistent states)");
  }
  add_reuse_edges(s);
}

std::vector<std::string> check_memory_plan(const Schedule& s) {
  std::vector<std::string> bad;
  const size_t n = s.steps.size();
  const size_t words = (n + 63) / 64;
  // reach[i]: the steps i depends on, directly or not (bit j set: j finishes before i starts)
  std::vector<std::vector<std::uint64_t>> reach(n, std::vector<std::uint64_t>(words, 0));
  for (size_t i = 0; i < n; ++i)
    for (int d : s.steps[i].deps) {
      if (d < 0 || size_t(d) >= i) continue;
      reach[i][size_t(d) / 64] |= std::uint64_t(1) << (size_t(d) % 64);
      for (size_t w = 0; w < words; ++w) reach[i][w] |= reach[size_t(d)][w];
    }
  auto before = [&](int a, int b) {  // a finishes before b starts in every order
    return a >= 0 && b >= 0 && (reach[size_t(b)][size_t(a) / 64] >> (size_t(a) % 64) & 1);
  };
  auto fail = [&](const std::string& what) {
    if (bad.size() < 20) bad.push_back(what);
  };
  const std::vector<std::vector<int>> users = users_of(s);
  for (size_t b = 0; b < s.buffers.size(); ++b) {
    const Buffer& buf = s.buffers[b];
    for (int u : users[b]) {
      if (u != buf.freed_at && !before(u, buf.freed_at))
        fail("buffer " + buf.name + ": step " + std::to_string(buf.freed_at) + " gives it back without waiting for step " +
             std::to_string(u) + ", which uses it");
    }
  }
  // buffers sharing bytes, per tier: the later one's users wait for the earlier one's release
  for (size_t i = 0; i < s.buffers.size(); ++i)
    for (size_t j = 0; j < s.buffers.size(); ++j) {
      const Buffer& a = s.buffers[i];
      const Buffer& b = s.buffers[j];
      if (i == j || a.tier != b.tier || a.arena_bytes == 0 || b.arena_bytes == 0) continue;
      if (a.offset + a.arena_bytes <= b.offset || b.offset + b.arena_bytes <= a.offset) continue;
      if (a.freed_at < b.made_at) {
        for (int u : users[j])
          if (!before(a.freed_at, u))
            fail("buffers " + a.name + " and " + b.name + " share bytes, but step " + std::to_string(u) + " (using " +
                 b.name + ") may run before step " + std::to_string(a.freed_at) + " gives " + a.name + " back");
      } else if (i < j && !(b.freed_at < a.made_at)) {
        fail("buffers " + a.name + " and " + b.name + " share bytes while both are alive");
      }
    }
  return bad;
}

}  // namespace memwall
