// recommend(): the plan `memwall plan` and the GUI's Plan tab give for the same input. Searches
// (planner/search.hpp), then checks the best candidates against the detailed schedule
// (build_schedule's per-rank peaks, with the sizes of whatever will run the plan), falls back to
// runners-up and smaller micro-batches, and explains the choice. A plan the detailed schedule
// rejects at every micro-batch is not recommended: `fits()` is false and `shortfall` says why, so
// no caller writes an overflowing plan.
// Pure function over value types; the Refiner and SizesFn are called from the calling thread.
#pragma once

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/result.hpp"
#include "model/schedule.hpp"
#include "planner/search.hpp"

namespace memwall::planner {

// The bytes per element a schedule for a candidate counts: the paper's (MemorySizes{}) unless an
// executor's are given (exec::schedule_sizes, for profiles `memwall run` executes).
using SizesFn = std::function<Result<MemorySizes>(const Candidate&)>;

struct Recommendation {
  CheckedSearch checked;                // the search that ran last, and the candidates the check rejected
  std::optional<Evaluated> chosen;      // the best candidate the detailed schedule accepts
  std::string schedule_check;           // the detailed check of `chosen` (or of the analytic best), one line
  std::vector<std::string> explanation; // why `chosen` won (explain()), rejected analytic choices first
  std::string shortfall;                // nothing fits: what to add (analytic) or why the schedule refuses
  bool fits() const { return chosen.has_value(); }
  const SearchResult& result() const { return checked.result; }
};

// One line when the candidate does not fit the detailed schedule, empty when it does.
std::string detailed_check(const ModelSpec& m, const HardwareProfile& p, const Candidate& c, const SizesFn& sizes = {});

Recommendation recommend(const ModelSpec& m, const HardwareProfile& p, const SearchSpace& space, const Fixes& fixes,
                         SearchOptions options, const SizesFn& sizes = {});

// The runners-up `memwall plan` and the GUI's Plan tab list beside `chosen`: the best of every
// other placement (SearchResult::ranked), then other micro-batches, checkpoint intervals and
// optimizer overlaps of any placement (SearchResult::top); variants that differ only in tiling or
// slicing are left out, and so are the candidates the detailed check rejected (`rejected`:
// CheckedSearch::rejected_keys). At most `count`, best first.
std::vector<const Evaluated*> runners_up(const SearchResult& r, const Evaluated& chosen, int count,
                                         const std::set<std::string>& rejected = {});

}  // namespace memwall::planner
