#include "planner/search.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <set>
#include <span>

#include "model/schedule.hpp"
#include "model/units.hpp"

namespace memwall::planner {
namespace {

bool same_states(const Placement& a, const Placement& b) {
  for (State s : {State::param16, State::grad16, State::optim32})
    if (a.of(s).tier != b.of(s).tier || a.of(s).partitioned != b.of(s).partitioned) return false;
  return a.fetch == b.fetch && a.layer_major == b.layer_major;
}

std::string key_of(const Placement& p) {
  std::string k;
  for (State s : kAllStates) k += std::string(to_string(p.of(s).tier)) + (p.of(s).partitioned ? "p" : "") + "/";
  return k + (p.fetch == ParamFetch::broadcast ? "b" : "a") + (p.layer_major ? "l" : "");
}

}  // namespace

std::string candidate_key(const Candidate& c) {
  const TrainingConfig& k = c.config;
  return key_of(c.placement) + "|" + format_g(k.bsz) + "/" + std::to_string(k.seq) + "/" + std::to_string(k.ci) + "/" +
         std::to_string(k.tiling_factor) + "/" + std::to_string(k.dp) + "/" + std::to_string(k.mp) + "/" +
         std::to_string(k.pp) + "/" + std::to_string(k.virtual_stages) + "/" + std::to_string(k.ep) + "/" + std::to_string(k.grad_accum) + "/" + std::to_string(k.micro_batches) + "/" +
         std::to_string(k.prefetch_depth) + "/" + std::to_string(k.optimizer_chunks) + "/" +
         to_string(k.optimizer_overlap) + "/" + std::to_string(k.dpu_warmup) + "/" + format_g(k.what_if.attention_density) +
         (k.what_if.onebit_adam ? "/1bit" : "") + (k.grad_clip > 0 ? "/clip" + format_g(k.grad_clip) : "");
}

std::string narrow_to_executor(SearchSpace& s, const Fixes& fixes) {
  std::string dropped;
  auto narrow = [&](std::vector<int>& degrees, const std::optional<int>& fixed, const char* name) {
    // fixed, or every degree left needs slicing (a placement that partitions checkpoints across mp)
    if (fixed || std::find(degrees.begin(), degrees.end(), 1) == degrees.end()) return;
    std::string these;
    for (int d : degrees)
      if (d > 1) these += (these.empty() ? "" : ", ") + std::to_string(d);
    if (these.empty()) return;
    dropped += (dropped.empty() ? "" : "; ") + std::string(name) + " " + these;
    degrees = {1};
  };
  // tensor slicing and pipeline stages run, the embedding whole on every slice
  s.executor = true;
  narrow(s.ep, fixes.ep, "ep");
  return dropped;
}

size_t SearchSpace::size() const {
  size_t n = 0;
  for (const Placement& p : placements) {
    size_t allowed = 0;
    for (OptimizerOverlap ov : overlaps) allowed += check_optimizer_overlap(p, ov, grad_clip).ok();
    const size_t mps = p.act_ckpt.partitioned ? size_t(std::count_if(mp.begin(), mp.end(), [](int x) { return x > 1; }))
                                              : mp.size();
    n += (p.param16.partitioned ? tiling.size() : 1) * allowed *
         (pipeline_allowed(p) ? pp.size() * virtual_stages.size() : 1) * mps;
  }
  return n * bsz.size() * ci.size() * ep.size();
}

std::string placement_label(const Placement& pl) {
  std::string base = "custom";
  // three_d has data_parallel's states: it is named so only when asked for (--fix strategy=three_d)
  const bool three_d = pl.name.starts_with("three_d");
  for (const std::string& name : preset_names()) {
    if ((name == "three_d") != three_d || name == "l2l") continue;
    if (same_states(*preset(name), pl)) {
      base = name;
      break;
    }
  }
  if (base == "custom") {
    std::string s = "custom(";
    for (State st : {State::param16, State::grad16, State::optim32})
      s += std::string(to_string(st)) + "=" + to_string(pl.of(st).tier) + (pl.of(st).partitioned ? "/p" : "") +
           (st == State::optim32 ? "" : ",");
    base = s + (pl.fetch == ParamFetch::broadcast ? ",broadcast" : "") + ")";
  }
  if (pl.act_ckpt.tier != Tier::gpu || pl.act_ckpt.partitioned)
    base += "+act_ckpt=" + std::string(to_string(pl.act_ckpt.tier)) + (pl.act_ckpt.partitioned ? "/p" : "");
  return base;
}

Result<SearchSpace> narrow_placements(SearchSpace s, const std::function<std::string(const Placement&)>& cannot,
                                      const std::string& who) {
  std::string first_reason;
  std::vector<Placement> kept;
  for (const Placement& pl : s.placements) {
    const std::string why = cannot(pl);
    if (why.empty()) kept.push_back(pl);
    else if (first_reason.empty()) first_reason = placement_label(pl) + ": " + why;
  }
  if (kept.empty()) return make_error(who + ": no placement left that it runs as planned (" + first_reason + ")");
  s.placements = std::move(kept);
  return s;
}

Result<SearchSpace> make_space(const ModelSpec& m, const HardwareProfile& p, const Fixes& fx) {
  SearchSpace s;
  // ---- placements ----
  std::vector<Placement> raw;
  if (fx.strategy) {
    if (*fx.strategy == "l2l")
      return make_error("--fix strategy=l2l: the planner does not model the layer-major l2l schedule (memwall schedule does)");
    Placement base = *preset(*fx.strategy == "three_d" ? "data_parallel" : *fx.strategy);
    base.name = *fx.strategy;
    for (const auto& [st, t] : fx.tiers) {
      base.of(st).tier = t;
      if (st != State::act_ckpt && t != Tier::gpu) base.of(st).partitioned = true;
    }
    if (fx.fetch) base.fetch = *fx.fetch;
    for (Tier a : {Tier::gpu, Tier::cpu}) {
      if (fx.tiers.count(State::act_ckpt) && fx.tiers.at(State::act_ckpt) != a) continue;
      Placement q = base;
      q.act_ckpt = {a, false};
      raw.push_back(q);
    }
    Result<Placement> ok = validate(raw.front());
    if (!ok) return make_error("--fix: " + ok.error());
  } else {
    const Tier tiers[] = {Tier::gpu, Tier::cpu, Tier::nvme};
    for (Tier tp : tiers)
      for (Tier tg : tiers)
        for (Tier to : tiers)
          for (int parts = 0; parts < 8; ++parts)
            for (ParamFetch fe : {ParamFetch::allgather, ParamFetch::broadcast})
              for (Tier ta : {Tier::gpu, Tier::cpu}) {
                Placement q;
                q.name = "custom";
                q.param16 = {tp, bool(parts & 1)};
                q.grad16 = {tg, bool(parts & 2)};
                q.optim32 = {to, bool(parts & 4)};
                q.act_ckpt = {ta, false};
                q.fetch = fe;
                // The broadcast variant only differs where whole parameters meet offloaded
                // gradients (ZeRO-Offload); elsewhere it would duplicate the all-gather one.
                if (fe == ParamFetch::broadcast && (q.param16.partitioned || q.grad16.tier == Tier::gpu)) continue;
                bool ok_fix = true;
                for (const auto& [st, t] : fx.tiers) ok_fix = ok_fix && q.of(st).tier == t;
                if (fx.fetch) ok_fix = ok_fix && q.fetch == *fx.fetch;
                if (ok_fix) raw.push_back(q);
              }
  }
  std::set<std::string> keys;
  std::string last_error;
  for (Placement& q : raw) {
    Result<Placement> ok = validate(q);
    if (!ok) {
      last_error = ok.error();
      continue;
    }
    if (fx.tiling && *fx.tiling > 1 && !q.param16.partitioned) continue;
    if (!keys.insert(key_of(q)).second) continue;
    if (!fx.strategy) q.name = placement_label(q);
    s.placements.push_back(q);
  }
  if (s.placements.empty()) {
    if (fx.tiling && *fx.tiling > 1)
      return make_error("--fix tiling=" + std::to_string(*fx.tiling) +
                        ": memory-centric tiling applies to partitioned parameters (ZeRO-3 family), and the fixed "
                        "placement keeps them whole");
    return make_error("--fix: no valid placement satisfies the fixed tiers (" + last_error + ")");
  }

  // ---- mp ----
  if (fx.mp) {
    if (*fx.mp > p.gpus_per_node)
      return make_error("--fix mp=" + std::to_string(*fx.mp) + ": tensor slicing stays inside a node of " +
                        std::to_string(p.gpus_per_node) + " GPUs");
    if (m.heads % *fx.mp != 0 || p.total_gpus() % *fx.mp != 0)
      return make_error("--fix mp=" + std::to_string(*fx.mp) + ": expected a divisor of the model's " +
                        std::to_string(m.heads) + " heads and of the profile's " + std::to_string(p.total_gpus()) + " GPUs");
    s.mp = {*fx.mp};
  } else {
    for (int mp = fx.strategy == "three_d" ? 2 : 1; mp <= p.gpus_per_node; mp *= 2)
      if (m.heads % mp == 0 && p.total_gpus() % mp == 0) s.mp.push_back(mp);
    if (s.mp.empty()) return make_error("--fix strategy=three_d: no tensor-slicing degree > 1 divides the model's heads");
  }
  // ---- pp: pipeline stages, for placements that keep parameters and gradients whole ----
  if (fx.pp) {
    if (*fx.pp > m.layers || p.total_gpus() % *fx.pp != 0)
      return make_error("--fix pp=" + std::to_string(*fx.pp) + ": expected a divisor of the profile's " +
                        std::to_string(p.total_gpus()) + " GPUs of at most the model's " + std::to_string(m.layers) +
                        " layers");
    if (*fx.pp > 1 && std::none_of(s.placements.begin(), s.placements.end(), pipeline_allowed))
      return make_error("--fix pp=" + std::to_string(*fx.pp) + ": pipeline stages need parameters and gradients whole "
                        "on every rank (DeepSpeed pipelines run with ZeRO stage 0 or 1), and no fixed placement has them");
    s.pp = {*fx.pp};
    // the placements that cannot run stages would run the plan unpipelined: --fix pp=2 gave pp 1
    if (*fx.pp > 1) std::erase_if(s.placements, [](const Placement& q) { return !pipeline_allowed(q); });
  } else if (fx.strategy == "three_d") {  // 3D parallelism: tensor slicing, pipeline and data
    s.pp.clear();
    for (int pp = 1; pp <= m.layers && p.total_gpus() % pp == 0; pp *= 2) s.pp.push_back(pp);
  }
  // ---- virtual stages: interleaved 1F1B over 1, 2 or 4 chunks per stage where pp > 1 ----
  if (fx.virtual_stages) {
    if (*fx.virtual_stages > 1 && std::none_of(s.pp.begin(), s.pp.end(), [&](int pp) {
          return pp > 1 && long(pp) * *fx.virtual_stages <= m.layers;
        }))
      return make_error("--fix virtual_stages=" + std::to_string(*fx.virtual_stages) +
                        ": interleaving needs pipeline stages (--fix pp=N, N > 1, or strategy=three_d) with at least one "
                        "of the model's " + std::to_string(m.layers) + " blocks per chunk");
    s.virtual_stages = {*fx.virtual_stages};
    if (*fx.virtual_stages > 1) std::erase_if(s.placements, [](const Placement& q) { return !pipeline_allowed(q); });
  } else if (std::any_of(s.pp.begin(), s.pp.end(), [](int pp) { return pp > 1; })) {
    s.virtual_stages = {1, 2, 4};
  }
  // Pipelines keep the checkpoints of their micro-batches in flight: where pipeline stages are
  // searched, the placements that allow them also come with their checkpoints partitioned across
  // the tensor-slicing ranks (DeepSpeed's partition_activations), tried at mp > 1 only.
  if (std::any_of(s.pp.begin(), s.pp.end(), [](int pp) { return pp > 1; }) &&
      std::any_of(s.mp.begin(), s.mp.end(), [](int mp) { return mp > 1; })) {
    const size_t n = s.placements.size();
    for (size_t i = 0; i < n; ++i) {
      if (!pipeline_allowed(s.placements[i])) continue;
      Placement q = s.placements[i];
      q.act_ckpt.partitioned = true;
      q.name = fx.strategy ? q.name + "+act_ckpt=" + to_string(q.act_ckpt.tier) + "/p" : placement_label(q);
      s.placements.push_back(q);
    }
  }
  // ---- ep: expert parallelism for a mixture of experts (powers of two dividing its experts) ----
  if (fx.ep) {
    if (*fx.ep > 1 && !m.is_moe())
      return make_error("--fix ep=" + std::to_string(*fx.ep) + ": expert parallelism splits a mixture of experts' "
                        "experts, and " + m.name + " is dense");
    if (*fx.ep > 1 && (m.moe.experts % *fx.ep != 0 || p.total_gpus() % *fx.ep != 0))
      return make_error("--fix ep=" + std::to_string(*fx.ep) + ": expected a divisor of the model's " +
                        std::to_string(m.moe.experts) + " experts and of the profile's " +
                        std::to_string(p.total_gpus()) + " GPUs");
    s.ep = {*fx.ep};
  } else if (m.is_moe()) {
    for (int e = 2; e <= m.moe.experts && e <= p.total_gpus(); e *= 2)
      if (m.moe.experts % e == 0) s.ep.push_back(e);
  }
  // ---- bsz, ci, tiling ----
  if (fx.bsz) s.bsz = {*fx.bsz};
  else
    for (int b = 1; b <= 32; ++b) s.bsz.push_back(b);
  if (fx.ci) {
    if (*fx.ci > m.layers)
      return make_error("--fix ci=" + std::to_string(*fx.ci) + ": expected a checkpoint interval between 1 and the model's " +
                        std::to_string(m.layers) + " layers");
    s.ci = {*fx.ci};
  } else {
    for (int ci : {1, 2, 3, 4, 5, 6, 8, 10, 12, 16})
      if (ci <= m.layers) s.ci.push_back(ci);
  }
  if (fx.tiling) s.tiling = {*fx.tiling};
  else s.tiling = {1, 2, 4, 8, 16, 32, 64};
  if (fx.prefetch_depth) s.prefetch_depth = *fx.prefetch_depth;
  // exact overlaps by default; dpu changes the training dynamics: only when fixed (or allowed by
  // the caller, who appends it)
  s.overlaps = {OptimizerOverlap::none, OptimizerOverlap::backward};
  if (fx.overlap) s.overlaps = {*fx.overlap};
  return s;
}

// ---------------------------------------------------------------------------------------------
double Evaluated::score() const {
  const double t = simulated_s ? *simulated_s : time.iteration_s;
  return t / global_batch(candidate.config);
}

double Evaluated::analytic_score() const { return time.iteration_s / global_batch(candidate.config); }

std::optional<double> Evaluated::simulated_tflops_per_gpu() const {
  if (!simulated_s || *simulated_s <= 0) return std::nullopt;
  return time.tflops_per_gpu * time.iteration_s / *simulated_s;
}

Evaluated evaluate(const ModelSpec& m, const Candidate& c, const HardwareProfile& p, const FitOptions& o) {
  return Evaluated{c, check_fit(m, c, p, o), estimate_time(m, c, p), std::nullopt};
}

namespace {

// The throughput ranking's keys that need no memory fit, in order: -1 when `a` ranks first, 1 when
// `b` does, 0 when they tie on all of them (the fit's keys then decide). `a` and `b` both simulated
// or both not.
// Below the analytic time's resolution two candidates tie: a few parts in 10^5 of a window's
// exposure (a zero_inf_cpu copy one tile late on local-cpu) must not outrank what the ties are
// broken by, less traffic per sample first.
constexpr double kTimeResolution = 1e-4;

int compare_by_time(const Evaluated& a, const Evaluated& b) {
  double sa = a.score(), sb = b.score();
  if (std::abs(sa - sb) > kTimeResolution * std::max(sa, sb)) return sa < sb ? -1 : 1;
  // Ties (e.g. every transfer hidden behind compute): less traffic per sample (a larger micro-batch
  // moves the parameters and gradients once for more samples), less tiling and slicing (their cost
  // is not in the analytic time), the optimizer after backward, then (in better()) less GPU
  // memory, fewer and nearer offloads (seed 001: offload only when GPU memory is short).
  const double ta = (a.time.param_grad_s + a.time.act_ckpt_s) / global_batch(a.candidate.config),
               tb = (b.time.param_grad_s + b.time.act_ckpt_s) / global_batch(b.candidate.config);
  if (std::abs(ta - tb) > 1e-9 * std::max(ta, tb)) return ta < tb ? -1 : 1;
  const auto& ca = a.candidate.config;
  const auto& cb = b.candidate.config;
  if (ca.tiling_factor != cb.tiling_factor) return ca.tiling_factor < cb.tiling_factor ? -1 : 1;  // smaller GEMMs cost
  if (ca.mp != cb.mp) return ca.mp < cb.mp ? -1 : 1;
  // the optimizer after backward where overlapping it gains nothing (nothing competes with
  // backward's own transfers)
  const bool na = ca.optimizer_overlap == OptimizerOverlap::none, nb = cb.optimizer_overlap == OptimizerOverlap::none;
  if (na != nb) return na ? -1 : 1;
  return 0;
}

bool better(const Evaluated& a, const Evaluated& b, Objective obj) {
  if (obj == Objective::max_model) {
    double ua = a.fit.worst_use(), ub = b.fit.worst_use();
    if (std::abs(ua - ub) > 1e-9 * std::max(ua, ub)) return ua < ub;
  }
  // Simulated and analytic times are never compared with each other: the simulated candidates (the
  // analytic best few, re-ranked) come first, ordered by simulated time; the rest follow in
  // analytic order, as the analytic ranking already put them behind.
  if (a.simulated_s.has_value() != b.simulated_s.has_value()) return a.simulated_s.has_value();
  if (const int c = compare_by_time(a, b); c != 0) return c < 0;
  auto offload = [](const Placement& q) {
    int w = 0;
    for (State s : {State::param16, State::grad16, State::optim32, State::act_ckpt}) w += int(q.of(s).tier);
    return w;
  };
  const double ga = a.fit.checks.front().needed_bytes, gb = b.fit.checks.front().needed_bytes;  // GPU memory
  if (std::abs(ga - gb) > 1e-9 * std::max(ga, gb)) return ga < gb;
  const int oa = offload(a.candidate.placement), ob = offload(b.candidate.placement);
  if (oa != ob) return oa < ob;
  return a.fit.worst_use() < b.fit.worst_use();
}

// Least oversubscribed: the smallest worst use, then the smallest sum of the failing uses.
bool closer(const FitReport& a, const FitReport& b) {
  const double wa = a.worst_use(), wb = b.worst_use();
  if (std::abs(wa - wb) > 1e-9 * std::max(wa, wb)) return wa < wb;
  auto over = [](const FitReport& f) {
    double sum = 0;
    for (const LimitCheck& c : f.checks)
      if (!c.fits()) sum += c.use();
    return sum;
  };
  return over(a) < over(b);
}

}  // namespace

bool pipeline_allowed(const Placement& pl) { return !pl.param16.partitioned && !pl.grad16.partitioned && !pl.layer_major; }

std::optional<std::pair<int, int>> split_global_batch(long global, double bsz, int max_dp) {
  if (global < 1 || !(bsz >= 1) || bsz != std::floor(bsz) || max_dp < 1) return std::nullopt;
  const long b = long(bsz);
  if (global % b != 0) return std::nullopt;
  const long rest = global / b;  // dp x grad_accum
  for (long dp = std::min<long>(rest, max_dp); dp >= 1; --dp)
    if (rest % dp == 0) {
      if (rest / dp > kMaxGradAccum) return std::nullopt;
      return std::make_pair(int(dp), int(rest / dp));
    }
  return std::nullopt;
}

Result<SearchSpace> with_global_batch(SearchSpace space, long global) {
  if (global < 1 || global > long(kMaxBsz) * kMaxGradAccum)
    return make_error("--global-batch: expected a number of samples from 1 to " +
                      std::to_string(long(kMaxBsz) * kMaxGradAccum) + ", got " + std::to_string(global));
  const std::vector<double> given = space.bsz;
  std::erase_if(space.bsz, [&](double b) { return !split_global_batch(global, b, 1); });
  if (space.bsz.empty())
    return make_error("--global-batch " + std::to_string(global) + ": not a multiple of the micro-batch " +
                      (given.size() == 1 ? format_g(given.front()) + " fixed by --fix bsz" : "any searched"));
  space.global_batch = global;
  return space;
}

std::string global_batch_words(const TrainingConfig& c, bool fixed, const HardwareProfile& p) {
  const std::string used = std::to_string(long(c.dp) * c.mp * c.pp) + " of " + std::to_string(p.total_gpus()) + " GPUs";
  if (fixed)
    return "global batch " + format_g(global_batch(c)) + " = bsz " + format_g(c.bsz) + " x grad-accum " +
           std::to_string(c.grad_accum) + " x dp " + std::to_string(c.dp) + " (--global-batch); " + used;
  return "global batch unconstrained: bsz " + format_g(c.bsz) +
         (c.grad_accum > 1 ? " x " + std::to_string(c.grad_accum) + " pipeline micro-batches" : std::string()) +
         " x dp " + std::to_string(c.dp) + " = " +
         format_g(global_batch(c)) + " samples per step, which changes with the plan (fix it with --global-batch N); " +
         used;
}

namespace {

std::optional<TrainingConfig> config_for(const ModelSpec& m, const HardwareProfile& p, double bsz, int ci, int tiling,
                                         int mp, int pp, int v, int ep, int depth, const WhatIf& what_if,
                                         std::optional<long> global) {
  if (v > 1 && (pp < 2 || long(pp) * v > m.layers)) return std::nullopt;
  TrainingConfig c;
  c.ep = ep;
  c.what_if = what_if;
  c.bsz = bsz;
  c.seq = m.seq;
  c.ci = ci;
  c.tiling_factor = tiling;
  c.mp = mp;
  c.pp = pp;
  c.virtual_stages = v;
  c.dp = p.total_gpus() / (mp * pp);
  c.prefetch_depth = depth;
  if (c.dp < 1) return std::nullopt;
  if (pp > 1) c.grad_accum = kPipelineMicroBatchesPerStage * pp;
  if (global) {
    auto split = split_global_batch(*global, bsz, c.dp);
    if (!split) return std::nullopt;
    std::tie(c.dp, c.grad_accum) = *split;
  }
  if (c.dp % ep != 0) return std::nullopt;
  if (v > 1 && c.grad_accum % pp != 0) return std::nullopt;  // interleaved: groups of pp micro-batches
  return c;
}

}  // namespace

CheckedSearch search_checked(const ModelSpec& m, const HardwareProfile& p, SearchSpace space,
                             const SearchOptions& options, const DetailCheck& check, int tries) {
  CheckedSearch out;
  for (;;) {
    out.result = search(m, p, space, options);
    ++out.searches;
    if (!out.result.fits()) return out;
    double largest_failed = 0;
    // the best of any placement, then the best of each placement (a slower placement that fits
    // beats a faster one that does not)
    std::vector<const Evaluated*> order;
    for (size_t i = 0; i < std::min(out.result.top.size(), size_t(std::max(1, tries))); ++i)
      order.push_back(&out.result.top[i]);
    for (const Evaluated& e : out.result.ranked) order.push_back(&e);
    std::stable_sort(order.begin(), order.end(),
                     [&](const Evaluated* a, const Evaluated* b) { return better(*a, *b, options.objective); });
    std::set<std::string> tried;  // a placement's best is often in the top list too: checked once
    for (const Evaluated* e : order) {
      const std::string key = candidate_key(e->candidate);
      if (!tried.insert(key).second) continue;
      const std::string why = check(e->candidate);
      if (why.empty()) {
        out.chosen = *e;
        return out;
      }
      largest_failed = std::max(largest_failed, e->candidate.config.bsz);
      out.rejected.push_back(why);
      out.rejected_keys.insert(key);
    }
    std::vector<double> smaller;
    for (double b : space.bsz)
      if (b < largest_failed) smaller.push_back(b);
    if (smaller.empty()) return out;
    space.bsz = smaller;
  }
}

SearchResult search(const ModelSpec& m, const HardwareProfile& p, const SearchSpace& space,
                    const SearchOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  SearchResult r;
  r.space_size = space.size();
  // tier_efficiencies' bandwidths (all estimate_time reads of them) depend on dp and mp only
  // (Search.TierBandwidthsDependOnDpAndMpOnly): made once per pair, and what estimate_time reads of
  // the model and profile once for the search.
  std::map<std::pair<int, int>, TierBandwidths> eff_cache;
  auto efficiencies = [&](const TrainingConfig& k) -> const TierBandwidths& {
    auto key = std::make_pair(k.dp, k.mp);
    auto it = eff_cache.find(key);
    if (it == eff_cache.end()) it = eff_cache.emplace(key, TierBandwidths::of(tier_efficiencies(p, m, k, k.dp))).first;
    return it->second;
  };
  const TimeFacts facts = TimeFacts::of(m, p);
  // The time alone orders candidates only for throughput (max-model ranks by memory first).
  const bool prune = o.prune && o.objective == Objective::throughput;
  std::vector<std::optional<Evaluated>> best(space.placements.size());
  const size_t top_n = size_t(std::max(1, o.keep)) * 4;
  auto cmp = [&](const Evaluated& a, const Evaluated& b) { return better(a, b, o.objective); };
  static const std::vector<int> untiled = {1};
  auto ep_allowed = [&](const Placement& pl, int ep) {
    TrainingConfig k;
    k.ep = ep;
    return ep == 1 || check_expert_parallel(m, pl, k).ok();
  };
  // A configuration (mp, pp, v, ep, ci, tiling) by micro-batch: config_for's training config (none
  // where the micro-batch does not divide the global batch), the bandwidths it sees, and its compute
  // per sample (compute_floor_per_sample), which no placement or overlap does better than: a
  // candidate whose floor already ranks behind both incumbents is pruned without its time (most of
  // the space on large machines: tiled or sliced GEMMs, small micro-batches).
  struct Row {
    std::vector<std::optional<TrainingConfig>> config;
    std::vector<const TierBandwidths*> eff;
    std::vector<double> floor;
    std::vector<const PassCompute*> pass;  // facts.pass of each config
    double least = std::numeric_limits<double>::infinity();  // the row's lowest floor
  };
  std::map<std::array<int, 6>, Row> rows;
  auto row_of = [&](const std::array<int, 6>& key) -> const Row& {
    auto [it, fresh] = rows.try_emplace(key);
    if (!fresh) return it->second;
    const auto [mp, pp, v, ep, ci, t] = key;
    Row& row = it->second;
    for (double b : space.bsz) {
      std::optional<TrainingConfig> k =
          config_for(m, p, b, ci, t, mp, pp, v, ep, space.prefetch_depth, space.what_if, space.global_batch);
      if (k) {
        k->grad_clip = space.grad_clip;
        k->embedding_replicated = space.executor && mp > 1;
      }
      row.eff.push_back(k ? &efficiencies(*k) : nullptr);
      row.pass.push_back(k ? &facts.pass(m, p, *k) : nullptr);
      row.floor.push_back(k ? compute_floor_per_sample(m, *k, *row.pass.back()) : 0.0);
      if (k) row.least = std::min(row.least, row.floor.back());
      row.config.push_back(std::move(k));
    }
    return row;
  };
  // Every candidate at least `floor` per sample ranks behind both the placement's best and the last
  // of a full top list (compare_by_time: slower by more than its resolution), fit or not.
  // The time per sample beyond which a candidate of placement `pi` ranks behind both (infinite
  // while either is missing).
  auto behind_both_above = [&](size_t pi) {
    if (!prune || !best[pi] || r.top.size() < top_n) return std::numeric_limits<double>::infinity();
    return std::max(best[pi]->score(), r.top.back().score()) / (1 - kTimeResolution);
  };
  auto behind_both = [&](size_t pi, double floor) { return floor > behind_both_above(pi); };
  auto behind = [&](size_t pi, const Evaluated& e) {
    return prune && best[pi] && r.top.size() >= top_n && compare_by_time(*best[pi], e) < 0 &&
           compare_by_time(r.top.back(), e) < 0;
  };
  // A fitting candidate enters the top list and its placement's best where it ranks before them.
  auto keep = [&](size_t pi, Evaluated e) {
    if (r.top.size() < top_n || cmp(e, r.top.back())) {
      r.top.insert(std::upper_bound(r.top.begin(), r.top.end(), e, cmp), e);
      if (r.top.size() > top_n) r.top.pop_back();
    }
    if (!best[pi] || better(e, *best[pi], o.objective)) best[pi] = std::move(e);
  };
  FitOptions numbers_only = o.fit;  // the words of the candidates kept are made at the end
  numbers_only.words = false;
  std::vector<TimeBreakdown> times;
  enum class Made : char { no, yes, behind };  // behind: every overlap's time ranks behind both incumbents
  std::vector<Made> made;
  for (size_t pi = 0; pi < space.placements.size(); ++pi) {
    const Placement& pl = space.placements[pi];
    const std::vector<int>& tilings = pl.param16.partitioned ? space.tiling : untiled;
    const std::vector<int>& stages = pipeline_allowed(pl) ? space.pp : untiled;
    std::vector<const Row*> order;  // the placement's configurations, in the space's order
    for (int mp : space.mp)
      for (int pp : stages)
        for (int v : pipeline_allowed(pl) ? space.virtual_stages : untiled)
          for (int ep : space.ep)
            if ((mp > 1 || !pl.act_ckpt.partitioned) && ep_allowed(pl, ep))  // partitioned checkpoints: across mp
              for (int ci : space.ci)
                for (int t : tilings) order.push_back(&row_of({mp, pp, v, ep, ci, t}));
    std::vector<OptimizerOverlap> overlaps;  // those the placement allows
    for (OptimizerOverlap ov : space.overlaps)
      if (check_optimizer_overlap(pl, ov, space.grad_clip)) overlaps.push_back(ov);
    for (const Row* rp : order) {
      const Row& cfg = *rp;
      if (behind_both(pi, cfg.least)) {  // the whole row, every overlap
        for (const auto& k : cfg.config) r.pruned += overlaps.size() * k.has_value();
        continue;
      }
      // a micro-batch's times under every overlap, made together the first time one is asked
      times.assign(space.bsz.size() * overlaps.size(), {});
      made.assign(space.bsz.size(), Made::no);
      for (size_t oi = 0; oi < overlaps.size(); ++oi) {
        const OptimizerOverlap ov = overlaps[oi];
        // The row's candidates, by bsz, that the time alone does not rank behind both incumbents
        // and that fit. Every limit grows with bsz: the first that misses ends the row, larger ones
        // cannot fit (not with a global batch: dp then changes with bsz, and with it each rank's
        // share). With the branch and bound, the fit is checked galloping (the 1st, 3rd, 7th, ...
        // candidate) up to the first that misses, then bisecting between: the largest that fits is
        // found in a few fits, and the ones below it are kept from the largest down (the least time
        // per sample first, usually), each raising the incumbents, so that the smaller ones they
        // then rank behind need no fit.
        auto fit = [&](Evaluated& e) {
          e.fit = check_fit(m, e.candidate, p, numbers_only);
          ++r.evaluated;
          const bool fits = e.fit.fits();
          if (!fits && (!r.closest || closer(e.fit, r.closest->fit))) r.closest = e;
          return fits;
        };
        const bool gallop = prune && !space.global_batch && !o.accept;
        std::vector<Evaluated> row;
        std::vector<bool> fitted;
        size_t lo = 0, hi = std::numeric_limits<size_t>::max(), probe = 0, step = 1;  // fit: [0, lo); not: [hi, ...)
        for (size_t bi = 0; bi < space.bsz.size(); ++bi) {
          if (!cfg.config[bi]) continue;  // bsz does not divide the global batch
          if (behind_both(pi, cfg.floor[bi])) {  // as the checks below would find, without the time
            ++r.pruned;
            continue;
          }
          const std::span<TimeBreakdown> each(times.data() + bi * overlaps.size(), overlaps.size());
          if (made[bi] == Made::no) {
            made[bi] = estimate_times(m, pl, *cfg.config[bi], p, facts, *cfg.eff[bi], overlaps, each,
                                      behind_both_above(pi), cfg.pass[bi])
                           ? Made::yes
                           : Made::behind;
          }
          // behind both incumbents (then, and they only get better), by more than the time's resolution
          if (made[bi] == Made::behind || each[oi].iteration_s / global_batch(*cfg.config[bi]) > behind_both_above(pi)) {
            ++r.pruned;
            continue;
          }
          Evaluated e{Candidate{pl, *cfg.config[bi]}, {}, each[oi], std::nullopt};
          e.candidate.config.optimizer_overlap = ov;
          // Branch and bound: a candidate the time alone ranks behind both its placement's best
          // so far and the last of a full top list cannot enter either, fit or not; its memory
          // fit (most of a candidate's cost) is not checked.
          if (behind(pi, e)) {
            ++r.pruned;
            continue;
          }
          if (space.global_batch) {
            if (fit(e)) row.push_back(std::move(e));
            continue;
          }
          row.push_back(std::move(e));
          fitted.push_back(false);
          if (row.size() - 1 == probe) {
            fitted.back() = true;
            if (!fit(row.back())) {
              hi = row.size() - 1;
              break;
            }
            lo = row.size();
            if (gallop) step *= 2;
            probe = lo + step - 1;
          }
        }
        if (!space.global_batch) {
          hi = std::min(hi, row.size());
          while (lo < hi) {
            const size_t mid = (lo + hi) / 2;
            fitted[mid] = true;
            if (fit(row[mid])) lo = mid + 1;
            else hi = mid;
          }
          row.resize(lo);
        }
        if (gallop) {
          for (size_t i = row.size(); i-- > 0;) {
            if (!fitted[i]) {
              if (behind(pi, row[i])) {
                ++r.pruned;
                continue;
              }
              fit(row[i]);  // below one that fits: it fits
            }
            keep(pi, std::move(row[i]));
          }
          continue;
        }
        // the detailed check is monotone in bsz too: bisect for the largest it accepts. Only for
        // rows whose best (the largest micro-batch: the least time per sample) would be kept.
        if (o.accept && space.global_batch) {  // not monotone in bsz (dp changes with it): each one
          std::erase_if(row, [&](const Evaluated& e) { return !o.accept(e.candidate).empty(); });
        } else if (o.accept && !row.empty()) {
          const Evaluated& last = row.back();
          const bool kept = r.top.size() < top_n || cmp(last, r.top.back()) || !best[pi] ||
                            better(last, *best[pi], o.objective);
          if (!kept) row.clear();
        }
        if (o.accept && !space.global_batch && !row.empty()) {
          size_t lo = 0, hi = row.size();  // accepted: [0, lo); rejected: [hi, size)
          while (lo < hi) {
            const size_t mid = (lo + hi) / 2;
            if (o.accept(row[mid].candidate).empty()) lo = mid + 1;
            else hi = mid;
          }
          row.resize(lo);
        }
        for (Evaluated& e : row) keep(pi, std::move(e));
      }
    }
  }
  for (auto& b : best)
    if (b) r.ranked.push_back(std::move(*b));
  // Pruning needs a fitting incumbent, so with nothing fitting nothing was pruned and `closest` saw
  // every candidate it would have seen.
  std::sort(r.ranked.begin(), r.ranked.end(), cmp);
  if (o.refine) {  // simulate the best few of each list once, then re-rank them by simulated time
    std::map<std::string, std::optional<double>> simulated;
    auto refine_list = [&](std::vector<Evaluated>& list) {
      const size_t n = std::min(list.size(), size_t(std::max(0, o.refine_top)));
      for (size_t i = 0; i < n; ++i) {
        const std::string key = candidate_key(list[i].candidate);
        auto it = simulated.find(key);
        if (it == simulated.end()) it = simulated.emplace(key, o.refine(list[i].candidate)).first;
        list[i].simulated_s = it->second;
      }
      std::stable_sort(list.begin(), list.begin() + long(n), cmp);
    };
    refine_list(r.top);
    refine_list(r.ranked);
  }
  if (r.ranked.size() > size_t(std::max(1, o.keep))) r.ranked.resize(size_t(std::max(1, o.keep)));
  if (o.fit.words) {
    for (auto* list : {&r.top, &r.ranked})
      for (Evaluated& e : *list) e.fit = check_fit(m, e.candidate, p, o.fit);
    if (r.closest) r.closest->fit = check_fit(m, r.closest->candidate, p, o.fit);
  }
  r.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace memwall::planner
