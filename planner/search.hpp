// The planner's search (the explanation is planner/explain.hpp, Fig. 6/7 planner/reproduce.hpp,
// the checked recommendation planner/recommend.hpp): every placement the paper's Table 2 allows plus per-state tier choices
// (placement validate() rejects meaningless ones) x micro-batch x checkpoint interval x tiling
// factor x tensor-slicing degree, filtered by memory fit and ranked by analytic iteration time
// (planner/fit.hpp). The placement order of the paper's evaluation (seed 001) is not coded here:
// it falls out of the ranking, and explain() checks the chosen plan against it in words.
// A Refiner (the simulator, once sim/ exists) may re-rank the best few.
// Pure functions over value types; a Refiner is called from the calling thread only.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "model/result.hpp"
#include "planner/fit.hpp"

namespace memwall::planner {

// Pins on dimensions of the space (the CLI's --fix key=value, parsed in cli/fix_flags): a preset,
// a tier per state, the fetch, bsz, ci, tiling, mp, prefetch depth, optimizer overlap.
struct Fixes {
  std::optional<std::string> strategy;
  std::map<State, Tier> tiers;
  std::optional<ParamFetch> fetch;
  std::optional<double> bsz;
  std::optional<int> ci, tiling, mp, pp, virtual_stages, ep, prefetch_depth;
  std::optional<OptimizerOverlap> overlap;  // optimizer_overlap=none|backward|dpu
};

struct SearchSpace {
  std::vector<Placement> placements;
  std::vector<double> bsz;    // ascending: fit is monotone in bsz, the search stops at the first miss
  std::vector<int> ci;
  std::vector<int> tiling;    // applies to placements with partitioned parameters; others use 1
  std::vector<int> mp;
  // Pipeline stages: tried for placements that keep parameters and gradients whole (DeepSpeed runs
  // pipelines with ZeRO stage 0 or 1 only); the others use 1. Without a global batch a pipeline
  // runs kPipelineMicroBatchesPerStage x pp micro-batches (1F1B's bubble then (pp-1)/(5 pp - 1)).
  std::vector<int> pp = {1};
  // Interleaved 1F1B's chunks per stage (TrainingConfig::virtual_stages), tried with every pp > 1 that
  // leaves each chunk a block and grad_accum a multiple of pp.
  std::vector<int> virtual_stages = {1};
  // Expert parallelism, for a mixture of experts: each degree that divides its experts (and the
  // candidate's dp, and is allowed with its placement: check_expert_parallel); 1 otherwise.
  std::vector<int> ep = {1};
  std::vector<OptimizerOverlap> overlaps = {OptimizerOverlap::none};  // tried where the placement allows
  int prefetch_depth = 3;
  WhatIf what_if;             // seed 004's what-ifs: the user's, copied into every candidate, never searched
  double grad_clip = 0;       // the user's gradient clipping (TrainingConfig::grad_clip), copied into every
                              // candidate: it rules out the backward overlap
// `--global-batch N`: every candidate trains N samples per optimizer step, bsz x grad_accum x dp
  // (split_global_batch); micro-batches that do not divide N are skipped. Nothing: dp is every GPU
  // not used by mp, no accumulation, and the global batch is whatever bsz x dp gives.
  std::optional<long> global_batch;
  // Plans for `memwall run` (narrow_to_executor): a sliced candidate's embedding is whole on every
  // mp rank (TrainingConfig::embedding_replicated).
  bool executor = false;
  size_t size() const;  // candidates in the space (placement x bsz x ci x tiling x mp x pp x v)
};

// Every valid (placement x act_ckpt tier x fetch) combination, then the fixes applied; errors
// when a fix contradicts the model or profile (mp larger than a node, ci above the layers, ...)
// or leaves no valid placement.
Result<SearchSpace> make_space(const ModelSpec& m, const HardwareProfile& p, const Fixes& fixes);

// Keeps the placements `cannot` returns "" for (the others' reasons name them); an error beginning
// with `who` and quoting the first reason when none is left. For planning for another runner
// (plan --for deepspeed, --for megatron).
Result<SearchSpace> narrow_placements(SearchSpace s, const std::function<std::string(const Placement&)>& cannot,
                                      const std::string& who);

// Planning for a profile `memwall run` executes (HardwareProfile::executor_backend): the executor
// runs data-parallel ranks, tensor slicing (its embedding whole on each slice) and pipeline stages,
// and no expert parallelism, so the searched ep narrows to 1, and every plan written runs. A degree
// the user fixed stays (plan and simulate it; `memwall run` refuses it with the reason), as do the
// degrees of a space where 1 is not one. Returns the narrowed dimensions ("ep 2, 4", ...), empty
// when nothing was.
std::string narrow_to_executor(SearchSpace& s, const Fixes& fixes);

inline constexpr int kPipelineMicroBatchesPerStage = 4;
// Whether a placement may run pipeline stages: parameters and gradients whole on every rank.
bool pipeline_allowed(const Placement& pl);

// dp and gradient-accumulation steps for a global batch of `global` samples at micro-batch `bsz`
// (a whole number) with at most `max_dp` data-parallel ranks: the largest dp that divides
// global / bsz, the accumulation making up the rest. Nothing when bsz does not divide `global`
// (or the accumulation would pass kMaxGradAccum). More ranks share the same work: the fastest.
std::optional<std::pair<int, int>> split_global_batch(long global, double bsz, int max_dp);

// `space` with every candidate training `global` samples per optimizer step (`--global-batch`):
// sets SearchSpace::global_batch and keeps the micro-batches that divide it; an error naming the
// flag when none does (a micro-batch fixed with --fix bsz).
Result<SearchSpace> with_global_batch(SearchSpace space, long global);

// "global batch 512 = bsz 4 x grad-accum 8 x dp 16 (--global-batch); 16 of 64 GPUs", or, when the
// search left it free, that it is unconstrained and what the plan's bsz x dp gives.
std::string global_batch_words(const TrainingConfig& c, bool fixed, const HardwareProfile& p);

// Everything that makes a candidate's schedule: equal keys, equal schedules (and simulated times,
// and detailed checks), so a search computes each once.
std::string candidate_key(const Candidate& c);

// Name of a placement: the Table 2 preset it equals (act_ckpt=cpu appended), else "custom".
std::string placement_label(const Placement& pl);

enum class Objective {
  throughput,  // most samples per second (equivalently TFLOPS per GPU)
  max_model,   // most memory headroom: the plan that would still fit the largest model
};

// A simulated iteration time for a candidate, or nothing when it cannot be simulated. sim/'s
// simulate() runs one SimGrid engine per process, so a refiner built on it runs each candidate in
// a child process (or replays a schedule another way); search() calls it at most 2 x refine_top
// times, each distinct candidate once.
using Refiner = std::function<std::optional<double>(const Candidate&)>;

// A detailed check of one candidate (build_schedule's own accounting, with the sizes of whatever
// will run it): empty when the candidate fits, else one line saying why not.
using DetailCheck = std::function<std::string(const Candidate&)>;

struct SearchOptions {
  Objective objective = Objective::throughput;
  FitOptions fit;
  // Optional: applied to every candidate the analytic fit accepts, as if it were one more limit
  // (a rejection prunes larger micro-batches too). For profiles an executor runs, where the
  // detailed schedule is small enough to build per candidate.
  DetailCheck accept;
  Refiner refine;          // empty: analytic only
  int refine_top = 5;      // how many of the best the refiner re-ranks
  int keep = 6;            // runners-up kept, one per distinct placement
  // Skip the memory fit of a candidate whose time ranks it behind both its placement's best and
  // the whole top list (throughput only): the same result, a fraction of the fits.
  bool prune = true;
};

struct Evaluated {
  Candidate candidate;
  FitReport fit;
  TimeBreakdown time;
  std::optional<double> simulated_s;  // from the refiner
  double score() const;  // iteration time per sample (lower is better), simulated when available
  double analytic_score() const;  // the same from the analytic estimate alone
  // The same FLOPs over the simulated iteration; nothing when it was not simulated.
  std::optional<double> simulated_tflops_per_gpu() const;
  const char* ranked_by() const { return simulated_s ? "simulated" : "analytic"; }
};

struct SearchResult {
  std::vector<Evaluated> ranked;    // fitting candidates, best first, one per distinct placement
  std::vector<Evaluated> top;       // the best 4 x keep fitting candidates of any placement, best first
  std::optional<Evaluated> closest; // nothing fits: the least oversubscribed candidate
  size_t space_size = 0;            // candidates in the space
  size_t evaluated = 0;             // candidates whose fit was checked
  size_t pruned = 0;                // candidates whose time ranked them behind the incumbents (not checked)
                                    // the rest: pruned by bsz monotonicity
  double elapsed_s = 0;
  bool fits() const { return !ranked.empty(); }
};

Evaluated evaluate(const ModelSpec& m, const Candidate& c, const HardwareProfile& p, const FitOptions& o = {});

struct CheckedSearch {
  SearchResult result;                // of the last search that ran
  std::optional<Evaluated> chosen;    // the best candidate the check accepted
  std::vector<std::string> rejected;  // candidates the analytic model preferred, with the reason
  std::set<std::string> rejected_keys;  // their candidate_key
  int searches = 0;
};
// search(), then its best candidates through `check`, best first: the best `tries` of any placement
// and the best of each placement. When none passes, the largest micro-batch that failed and those
// above it leave the space and the search runs again: activation memory grows with the micro-batch,
// and it is what an executor's buffers add most to the analytic count. Stops when one passes or no
// micro-batch is left.
CheckedSearch search_checked(const ModelSpec& m, const HardwareProfile& p, SearchSpace space,
                             const SearchOptions& options, const DetailCheck& check, int tries = 4);

SearchResult search(const ModelSpec& m, const HardwareProfile& p, const SearchSpace& space,
                    const SearchOptions& options = {});

}  // namespace memwall::planner
