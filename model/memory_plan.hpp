// The memory plan of a schedule (DESIGN.md, "The contract, typed and planned"): every buffer gets
// a place in its tier's arena before anything runs, as ggml's gallocr does for a graph, and the
// schedule gets the dependencies that make those places safe in every order its dependencies
// allow: a buffer placed on bytes another buffer used is not touched before the step that gave
// them back has completed. An executor then puts buffers at their offsets and never searches for
// room; admission is the arena's size, decided here.
// Also the one walk over the buffers' lifetimes: the plan, the peaks and overflow, the live bytes
// per step and the invariants all follow it. Pure functions over value types: thread-safe.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "model/schedule.hpp"

namespace memwall {

// The buffers' lifetimes in schedule order: for each step, its allocs are made, then it runs,
// then its frees are given back.
template <typename Alloc, typename Run, typename Free>
void walk_buffers(const Schedule& s, Alloc&& on_alloc, Run&& on_step, Free&& on_free) {
  for (const Step& st : s.steps) {
    for (int b : st.allocs) on_alloc(st, b);
    on_step(st);
    for (int b : st.frees) on_free(st, b);
  }
}

// Bytes of buffers on `tier` alive once each step has started, walking the steps in order: what
// peak_bytes is the maximum of, besides the persistent states.
std::vector<double> buffer_bytes_by_step(const Schedule& s, Tier tier);

// How large each tier's buffer arena may be: the tier's capacity less the persistent states
// (beyond: the schedule overflows), and how much of it the plan may use to spread buffers out when
// they fit in less (the CPU tier: no more than the rank's pinned budget, where an executor keeps
// these buffers).
struct PlanLimits {
  std::array<double, kTiers> hard_bytes{}, room_bytes{};
};
PlanLimits plan_limits(const Schedule& s, double pinned_per_rank_bytes);

// Sets every buffer's made_at, freed_at, arena_bytes and offset, the schedule's peak_bytes
// (persistent states plus live buffers), overflow (the first tier whose capacity the live bytes,
// or the arena the offsets need, exceed), arena_bytes and memory_edges, and adds the dependencies
// the offsets need. The offsets: largest buffer first, each at the lowest offset clear of every
// buffer placed already whose lifetime overlaps its own (within a few percent of the live peak).
// With room to spare (PlanLimits::room_bytes) the offsets use up to twice the live peak to keep
// reuse far apart in time: laid out in time order, each buffer on the bytes given back longest ago;
// or, when that does not fit, packed with a reuse distance of 8 or 2 steps (between a buffer's
// release and the next buffer on its bytes). Either spares most waits.
// The dependencies: walking the steps, a buffer made on bytes another gave back waits, at every
// step that uses it, for the step that gave them back (unless a direct dependency already does).
// Expects buffers made once and given back once (check_invariants says otherwise).
void plan_memory(Schedule& s, const PlanLimits& limits);

// The plan holds for every order the dependencies allow (the reachability check, O(steps^2 / 64)
// memory: for tests and small schedules): every step using a buffer comes before the one that
// gives it back, of two buffers sharing bytes the later one's every user comes after the earlier
// one is given back, and no two buffers alive at one step share bytes. (Two steps that fill parts
// of one buffer, a chunk's states and gradients read from NVMe, need not wait for each other.)
// Empty when all hold.
std::vector<std::string> check_memory_plan(const Schedule& s);

}  // namespace memwall
