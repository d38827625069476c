#include "planner/recommend.hpp"

#include <map>
#include <set>

#include <algorithm>

#include "model/memory.hpp"
#include "model/units.hpp"
#include "planner/explain.hpp"

namespace memwall::planner {
namespace {

Result<MemorySizes> sizes_of(const SizesFn& sizes, const Candidate& c) {
  return sizes ? sizes(c) : Result<MemorySizes>(MemorySizes{});
}

// The memory check builds two micro-steps at most (pp + 1 with pipeline stages, so that as many
// micro-batches are in flight as ever will be): every later one repeats the buffers of the one
// before from the same state (tests/model/test_grad_accum.cpp holds the peaks equal), and a
// schedule of hundreds of micro-steps would be refused for its size rather than for its memory.
// Interleaved over v chunks, the first stage runs 2 (pp - 1) + (v - 1) pp forwards before its first
// backward: 2 pp micro-steps (a multiple of pp, as interleaving needs) reach every pass in flight.
Candidate memory_checked(Candidate c) {
  c.config.grad_accum =
      std::min(c.config.grad_accum, c.config.virtual_stages > 1 ? 2 * c.config.pp : std::max(2, c.config.pp + 1));
  return c;
}

std::string words(const Candidate& c) {
  return placement_label(c.placement) + ", bsz " + format_g(c.config.bsz) + ", ci " + std::to_string(c.config.ci) +
         ", tiling " + std::to_string(c.config.tiling_factor);
}

// A check's verdict on a candidate (empty: it fits): the sentence the search reports, and the same
// reason as a clause about the candidate, for explain's alternatives ("overflows in the detailed
// schedule: ...").
struct Verdict {
  std::string sentence, clause;
  bool fits() const { return sentence.empty(); }
};

// `head` names the candidate at the head of the sentence, "zero3, bsz 2, ci 16, tiling 1 ".
Verdict refuse(const std::string& head, const std::string& clause) { return {head + clause, clause}; }

Verdict schedule_refuses(const std::string& why) {
  return {"schedule check: " + why, "the schedule check refuses it: " + why};
}

// The detailed check of one candidate: why it does not fit (empty when it does) and the one-line
// summary of its schedule's peaks (empty when no schedule was built).
struct Checked {
  Verdict verdict;
  std::string summary;
};

// What refuses a candidate before any peak is computed: the executor's buffer sizes, its activation
// workspace alone (a lower bound of its GPU peak), a schedule too large to build here. Sets `z`.
Verdict precheck(const ModelSpec& m, const HardwareProfile& p, const Candidate& c, const SizesFn& sizes,
                 MemorySizes& z) {
  const Result<MemorySizes> got = sizes_of(sizes, c);
  if (!got) return schedule_refuses(got.error());
  z = *got;
  if (const double usable = capacity_per_rank(c.config, p)[size_t(Tier::gpu)]; z.workspace_bytes > usable) {
    const std::string reserve = describe_gpu_reserve(c.config, p);
    return refuse(placement_label(c.placement) + ", bsz " + format_g(c.config.bsz) + ": ",
                  "the executor's activation workspace (" + format_bytes(z.workspace_bytes) +
                      ") alone exceeds GPU memory (" + format_bytes(usable) +
                      (reserve.empty() ? "" : " of " + format_bytes(p.gpu_memory_bytes) + " less " + reserve) + ")");
  }
  if (Result<TrainingConfig> ok = check_schedule_size(m, c.placement, c.config, p); !ok)
    return schedule_refuses(ok.error());
  return {};
}

// The memory model's verdict (empty: fits), the search's filter on profiles an executor runs: the
// schedule's peaks in closed form, microseconds where building the schedule takes a millisecond or
// more; equal to the schedule's walk (tests/model/test_memory.cpp; an upper bound for the CPU with
// NVMe optimizer chunks), so it refuses what the schedule would. search_checked confirms the
// winner with the schedule itself (check_candidate).
Verdict model_check(const ModelSpec& m, const HardwareProfile& p, const Candidate& given, const SizesFn& sizes) {
  const Candidate c = memory_checked(given);
  MemorySizes z;
  if (Verdict v = precheck(m, p, c, sizes, z); !v.fits()) return v;
  const FullestStages fs = fullest_stages(m, c.placement, c.config, p, 0, z);
  for (Tier t : {Tier::gpu, Tier::cpu, Tier::nvme}) {
    const MemoryModel& mm = fs.of(t);
    if (!mm.of(t).fits())
      return refuse(words(c) + " ", std::string("overflows in the memory model (the executor's buffers): ") +
                                        to_string(t) + " needs " + format_bytes(mm.of(t).peak_bytes) + " of " +
                                        format_bytes(mm.of(t).capacity_bytes) + " per rank");
  }
  return {};
}

Checked check_candidate(const ModelSpec& m, const HardwareProfile& p, const Candidate& given, const SizesFn& sizes) {
  const Candidate c = memory_checked(given);
  MemorySizes z;
  if (Verdict v = precheck(m, p, c, sizes, z); !v.fits()) {
    const std::string summary = v.sentence.starts_with("schedule check: ") ? v.sentence : "schedule check: " + v.sentence;
    return {std::move(v), summary};
  }
  // pipeline stages: the stages the memory model finds fullest on the GPU and in CPU memory
  // (fullest_stages), the first to overflow or else the larger GPU peak
  const FullestStages fs = c.config.pp > 1 ? fullest_stages(m, c.placement, c.config, p, 0, z) : FullestStages{};
  Result<Schedule> sched = build_schedule(m, c.placement, c.config, p, 0, z, fs.stage[size_t(Tier::gpu)]);
  if (const int other = fs.stage[size_t(Tier::cpu)]; sched && !sched->overflow && other != sched->stage) {
    Result<Schedule> next = build_schedule(m, c.placement, c.config, p, 0, z, other);
    if (!next || next->overflow || next->peak_bytes[0] > sched->peak_bytes[0]) sched = std::move(next);
  }
  if (!sched) return {schedule_refuses(sched.error()), "schedule check: " + sched.error()};
  Checked out;
  out.summary = std::string("schedule check (build_schedule, rank 0") +
                (sched->pp > 1 ? ", stage " + std::to_string(sched->stage) + " of " + std::to_string(sched->pp) : "") +
                (p.executor_backend.empty() ? "" : ", the executor's buffers") + "): GPU peak " +
                format_bytes(sched->peak_bytes[0]) + " of " + format_bytes(sched->capacity_bytes[0]) + ", CPU peak " +
                format_bytes(sched->peak_bytes[1]) + " of " + format_bytes(sched->capacity_bytes[1]) +
                " per rank: " + (sched->overflow ? sched->overflow->message : std::string("fits"));
  if (sched->overflow)
    out.verdict = refuse(words(c) + " ", std::string("overflows in the detailed schedule") +
                                             (p.executor_backend.empty() ? "" : " (the executor's buffers)") + ": " +
                                             sched->overflow->message);
  return out;
}

}  // namespace

std::string detailed_check(const ModelSpec& m, const HardwareProfile& p, const Candidate& c, const SizesFn& sizes) {
  return check_candidate(m, p, c, sizes).verdict.sentence;
}

Recommendation recommend(const ModelSpec& m, const HardwareProfile& p, const SearchSpace& space, const Fixes& fixes,
                         SearchOptions options, const SizesFn& sizes) {
  Recommendation out;
  std::string last_passed;  // the summary of the last candidate the check accepted
  // Each candidate's schedule is built once: the search's own check (executor profiles) and
  // search_checked's, and the searches search_checked repeats with fewer micro-batches, ask again.
  std::map<std::string, Checked> checked;
  auto check = [&](const Candidate& c) {
    auto it = checked.find(candidate_key(c));
    if (it == checked.end()) it = checked.emplace(candidate_key(c), check_candidate(m, p, c, sizes)).first;
    if (it->second.verdict.fits()) last_passed = it->second.summary;
    return it->second.verdict.sentence;
  };
  // For profiles an executor runs, the memory model checks every candidate the analytic fit accepts
  // (the executor's buffer sizes); for every profile the schedule checks the best few after the search.
  std::map<std::string, Verdict> modelled;
  if (!p.executor_backend.empty() && !options.prune)  // --exhaustive: every candidate's schedule, the reference
    options.accept = check;
  else if (!p.executor_backend.empty())
    options.accept = [&](const Candidate& c) {
      auto it = modelled.find(candidate_key(c));
      if (it == modelled.end()) it = modelled.emplace(candidate_key(c), model_check(m, p, c, sizes)).first;
      return it->second.sentence;
    };
  out.checked = search_checked(m, p, space, options, check, 4 * std::max(1, options.keep));
  const SearchResult& r = out.checked.result;
  if (!r.fits()) {
    out.shortfall = shortfall_advice(m, p, fixes, r, options);
    return out;
  }
  out.chosen = out.checked.chosen;
  // the chosen candidate's check was the last to pass: its summary is kept, not built again
  out.schedule_check = out.chosen ? last_passed : check_candidate(m, p, r.top.front().candidate, sizes).summary;
  if (!out.chosen) {
    // the analytic model said yes, the detailed schedule no, at every micro-batch
    out.shortfall = m.name + " fits nowhere on " + p.name + " in the detailed schedule" +
                    (p.executor_backend.empty() ? "" : " (the executor's buffers)") + ": " + out.schedule_check;
    return out;
  }
  // the alternatives explain tries that a detailed check refused already (none is checked anew)
  auto refused = [&](const Candidate& c) -> std::string {
    const std::string key = candidate_key(c);
    if (auto it = checked.find(key); it != checked.end() && !it->second.verdict.fits()) return it->second.verdict.clause;
    if (auto it = modelled.find(key); it != modelled.end()) return it->second.clause;
    return "";
  };
  out.explanation = explain(m, p, space, *out.chosen, options, refused);
  const std::vector<std::string>& rejected = out.checked.rejected;
  std::vector<std::string> lines;  // the first three and the last, each a point of its own
  for (size_t i = 0; i < rejected.size(); ++i)
    if (i < 3 || i + 1 == rejected.size()) lines.push_back("analytic choice rejected: " + rejected[i]);
  out.explanation.insert(out.explanation.begin(), lines.begin(), lines.end());
  return out;
}

std::vector<const Evaluated*> runners_up(const SearchResult& r, const Evaluated& chosen, int count,
                                         const std::set<std::string>& rejected) {
  auto key = [](const Evaluated& e) {
    return placement_label(e.candidate.placement) + "/" + format_g(e.candidate.config.bsz) + "/" +
           std::to_string(e.candidate.config.ci) + "/" + to_string(e.candidate.config.optimizer_overlap);
  };
  std::vector<const Evaluated*> out;
  std::set<std::string> shown = {key(chosen)};
  for (const auto* list : {&r.ranked, &r.top})
    for (const Evaluated& e : *list)
      if (int(out.size()) < count && !rejected.contains(candidate_key(e.candidate)) && shown.insert(key(e)).second)
        out.push_back(&e);
  return out;
}

}  // namespace memwall::planner
