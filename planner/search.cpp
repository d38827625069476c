#include "planner/search.hpp"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cmath>
#include <set>
#include <sstream>

#include "model/schedule.hpp"
#include "model/units.hpp"

namespace memwall::planner {
namespace {

constexpr State kStates[] = {State::param16, State::grad16, State::optim32, State::act_ckpt};

std::optional<State> state_named(const std::string& s) {
  for (State st : kStates)
    if (s == to_string(st)) return st;
  return std::nullopt;
}

const char* state_words(State s) {
  switch (s) {
    case State::param16: return "parameters";
    case State::grad16: return "gradients";
    case State::optim32: return "optimizer states";
    case State::act_ckpt: return "activation checkpoints";
  }
  return "?";
}

const char* tier_words(Tier t) {
  switch (t) {
    case Tier::gpu: return "GPU";
    case Tier::cpu: return "CPU";
    case Tier::nvme: return "NVMe";
  }
  return "?";
}

bool same_states(const Placement& a, const Placement& b) {
  for (State s : {State::param16, State::grad16, State::optim32})
    if (a.of(s).tier != b.of(s).tier || a.of(s).partitioned != b.of(s).partitioned) return false;
  return a.fetch == b.fetch && a.layer_major == b.layer_major;
}

std::string key_of(const Placement& p) {
  std::string k;
  for (State s : kStates) k += std::string(to_string(p.of(s).tier)) + (p.of(s).partitioned ? "p" : "") + "/";
  return k + (p.fetch == ParamFetch::broadcast ? "b" : "a") + (p.layer_major ? "l" : "");
}

Result<int> parse_int(const std::string& key, const std::string& v, int min_value, int max_value) {
  int x = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || end != v.data() + v.size() || x < min_value || x > max_value)
    return make_error("--fix " + key + ": expected an integer from " + std::to_string(min_value) + " to " +
                      std::to_string(max_value) + ", got \"" + v + "\"");
  return x;
}

std::string fmt_tflops(double t) { return format_sig(t, 3) + " TFLOPS"; }

}  // namespace

// ---------------------------------------------------------------------------------------------
Result<Fixes> parse_fixes(const std::vector<std::string>& key_values) {
  Fixes f;
  std::map<std::string, std::string> seen;
  const std::string keys =
      "strategy, param16, grad16, optim32, act_ckpt, fetch, bsz, ci, tiling, mp, prefetch_depth, optimizer_overlap";
  for (const std::string& kv : key_values) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == kv.size())
      return make_error("--fix: expected key=value (keys: " + keys + "), got \"" + kv + "\"");
    const std::string key = kv.substr(0, eq), value = kv.substr(eq + 1);
    if (auto it = seen.find(key); it != seen.end() && it->second != value)
      return make_error("--fix: " + key + " given twice with different values (" + it->second + " and " + value + ")");
    seen[key] = value;
    if (key == "strategy") {
      Result<Placement> p = preset(value);
      if (!p) return make_error("--fix strategy: unknown strategy \"" + value + "\"");
      f.strategy = value;
    } else if (auto st = state_named(key)) {
      Result<Tier> t = parse_tier(value);
      if (!t) return make_error("--fix " + key + ": " + t.error());
      f.tiers[*st] = *t;
    } else if (key == "fetch") {
      if (value != "allgather" && value != "broadcast")
        return make_error("--fix fetch: expected allgather or broadcast, got \"" + value + "\"");
      f.fetch = value == "broadcast" ? ParamFetch::broadcast : ParamFetch::allgather;
    } else if (key == "bsz") {
      Result<double> b = parse_quantity(value, Dimension::count);
      if (!b || !(*b > 0) || *b > kMaxBsz)
        return make_error("--fix bsz: expected a micro-batch per GPU > 0 and at most " + format_g(kMaxBsz) + ", got \"" +
                          value + "\"");
      f.bsz = *b;
    } else if (key == "ci" || key == "tiling" || key == "mp" || key == "prefetch_depth") {
      const int most = key == "ci" ? kMaxLayers : key == "tiling" ? kMaxTiling : key == "mp" ? kMaxMp : kMaxPrefetchDepth;
      Result<int> x = parse_int(key, value, key == "prefetch_depth" ? 0 : 1, most);
      if (!x) return make_error(x.error());
      (key == "ci" ? f.ci : key == "tiling" ? f.tiling : key == "mp" ? f.mp : f.prefetch_depth) = *x;
    } else if (key == "optimizer_overlap") {
      Result<OptimizerOverlap> ov = parse_optimizer_overlap(value);
      if (!ov) return make_error("--fix optimizer_overlap: expected none, backward or dpu, got \"" + value + "\"");
      f.overlap = *ov;
    } else {
      return make_error("--fix: unknown key \"" + key + "\" (expected one of: " + keys + ")");
    }
  }
  if (f.strategy == "three_d" && f.mp == 1)
    return make_error("--fix: strategy=three_d and mp=1 contradict each other (three_d is data parallelism with tensor slicing, mp > 1)");
  return f;
}

size_t SearchSpace::size() const {
  size_t n = 0;
  for (const Placement& p : placements) {
    size_t allowed = 0;
    for (OptimizerOverlap ov : overlaps) allowed += check_optimizer_overlap(p, ov).ok();
    n += (p.param16.partitioned ? tiling.size() : 1) * allowed;
  }
  return n * bsz.size() * ci.size() * mp.size();
}

std::string placement_label(const Placement& pl) {
  std::string base = "custom";
  for (const std::string& name : preset_names()) {
    if (name == "three_d" || name == "l2l") continue;
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
  if (pl.act_ckpt.tier != Tier::gpu) base += "+act_ckpt=" + std::string(to_string(pl.act_ckpt.tier));
  return base;
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
  return t / (candidate.config.bsz * candidate.config.dp);
}

double Evaluated::analytic_score() const { return time.iteration_s / (candidate.config.bsz * candidate.config.dp); }

std::optional<double> Evaluated::simulated_tflops_per_gpu() const {
  if (!simulated_s || *simulated_s <= 0) return std::nullopt;
  return time.tflops_per_gpu * time.iteration_s / *simulated_s;
}

Evaluated evaluate(const ModelSpec& m, const Candidate& c, const HardwareProfile& p, const FitOptions& o) {
  return Evaluated{c, check_fit(m, c, p, o), estimate_time(m, c, p), std::nullopt};
}

namespace {

bool better(const Evaluated& a, const Evaluated& b, Objective obj) {
  if (obj == Objective::max_model) {
    double ua = a.fit.worst_use(), ub = b.fit.worst_use();
    if (std::abs(ua - ub) > 1e-9 * std::max(ua, ub)) return ua < ub;
  }
  // Simulated and analytic times are never compared with each other: the simulated candidates (the
  // analytic best few, re-ranked) come first, ordered by simulated time; the rest follow in
  // analytic order, as the analytic ranking already put them behind.
  if (a.simulated_s.has_value() != b.simulated_s.has_value()) return a.simulated_s.has_value();
  double sa = a.score(), sb = b.score();
  if (std::abs(sa - sb) > 1e-9 * std::max(sa, sb)) return sa < sb;
  // Ties (e.g. every transfer hidden behind compute): less traffic, less tiling and slicing (their
  // cost is not in the analytic time), less GPU memory, then fewer and nearer offloads (seed 001:
  // offload only when GPU memory is short).
  auto offload = [](const Placement& q) {
    int w = 0;
    for (State s : {State::param16, State::grad16, State::optim32, State::act_ckpt}) w += int(q.of(s).tier);
    return w;
  };
  const double ta = a.time.param_grad_s + a.time.act_ckpt_s, tb = b.time.param_grad_s + b.time.act_ckpt_s;
  if (std::abs(ta - tb) > 1e-9 * std::max(ta, tb)) return ta < tb;
  const auto& ca = a.candidate.config;
  const auto& cb = b.candidate.config;
  if (ca.tiling_factor != cb.tiling_factor) return ca.tiling_factor < cb.tiling_factor;  // smaller GEMMs cost
  if (ca.mp != cb.mp) return ca.mp < cb.mp;
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

TrainingConfig config_for(const ModelSpec& m, const HardwareProfile& p, double bsz, int ci, int tiling, int mp,
                          int depth, const WhatIf& what_if) {
  TrainingConfig c;
  c.what_if = what_if;
  c.bsz = bsz;
  c.seq = m.seq;
  c.ci = ci;
  c.tiling_factor = tiling;
  c.mp = mp;
  c.dp = p.total_gpus() / mp;
  c.prefetch_depth = depth;
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
    for (const Evaluated* e : order) {
      const std::string why = check(e->candidate);
      if (why.empty()) {
        out.chosen = *e;
        return out;
      }
      largest_failed = std::max(largest_failed, e->candidate.config.bsz);
      out.rejected.push_back(why);
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
  // tier_efficiencies depends on (bsz, ci, mp) only: computed once per combination.
  std::map<std::tuple<double, int, int>, std::vector<StateTierEfficiency>> eff_cache;
  std::vector<std::optional<Evaluated>> best(space.placements.size());
  const size_t top_n = size_t(std::max(1, o.keep)) * 4;
  auto cmp = [&](const Evaluated& a, const Evaluated& b) { return better(a, b, o.objective); };
  static const std::vector<int> untiled = {1};
  for (size_t pi = 0; pi < space.placements.size(); ++pi) {
    const Placement& pl = space.placements[pi];
    const std::vector<int>& tilings = pl.param16.partitioned ? space.tiling : untiled;
    for (int mp : space.mp)
      for (int ci : space.ci)
        for (int t : tilings)
          for (OptimizerOverlap ov : space.overlaps) {
            if (!check_optimizer_overlap(pl, ov)) continue;
            // every limit grows with bsz: the first that misses ends the row, larger ones cannot fit
            std::vector<std::pair<Candidate, FitReport>> row;
            for (double bsz : space.bsz) {
              Candidate c{pl, config_for(m, p, bsz, ci, t, mp, space.prefetch_depth, space.what_if)};
              c.config.optimizer_overlap = ov;
              FitReport fit = check_fit(m, c, p, o.fit);
              ++r.evaluated;
              if (!fit.fits()) {
                if (!r.closest || closer(fit, r.closest->fit))
                  r.closest = Evaluated{c, fit, estimate_time(m, c, p), std::nullopt};
                break;
              }
              row.emplace_back(std::move(c), std::move(fit));
            }
            // the detailed check is monotone in bsz too: bisect for the largest it accepts. Only for
            // rows whose best (the largest micro-batch: the least time per sample) would be kept.
            if (o.accept && !row.empty()) {
              Evaluated last{row.back().first, row.back().second, estimate_time(m, row.back().first, p), std::nullopt};
              const bool kept = r.top.size() < top_n || cmp(last, r.top.back()) || !best[pi] ||
                                better(last, *best[pi], o.objective);
              if (!kept) row.clear();
            }
            if (o.accept && !row.empty()) {
              size_t lo = 0, hi = row.size();  // accepted: [0, lo); rejected: [hi, size)
              while (lo < hi) {
                const size_t mid = (lo + hi) / 2;
                if (o.accept(row[mid].first).empty()) lo = mid + 1;
                else hi = mid;
              }
              row.resize(lo);
            }
            for (auto& [c, fit] : row) {
              const double bsz = c.config.bsz;
              auto key = std::make_tuple(bsz, ci, mp);
              auto it = eff_cache.find(key);
              if (it == eff_cache.end()) it = eff_cache.emplace(key, tier_efficiencies(p, m, c.config, c.config.dp)).first;
              Evaluated e{std::move(c), std::move(fit), {}, std::nullopt};
              e.time = estimate_time(m, e.candidate, p, it->second);
              if (r.top.size() < top_n || cmp(e, r.top.back())) {
                r.top.insert(std::upper_bound(r.top.begin(), r.top.end(), e, cmp), e);
                if (r.top.size() > top_n) r.top.pop_back();
              }
              if (!best[pi] || better(e, *best[pi], o.objective)) best[pi] = std::move(e);
            }
          }
  }
  for (auto& b : best)
    if (b) r.ranked.push_back(std::move(*b));
  std::sort(r.ranked.begin(), r.ranked.end(), cmp);
  if (o.refine) {  // simulate the best few of each list once, then re-rank them by simulated time
    std::map<std::string, std::optional<double>> simulated;
    auto refine_list = [&](std::vector<Evaluated>& list) {
      const size_t n = std::min(list.size(), size_t(std::max(0, o.refine_top)));
      for (size_t i = 0; i < n; ++i) {
        const TrainingConfig& k = list[i].candidate.config;
        const std::string key = key_of(list[i].candidate.placement) + format_g(k.bsz) + "/" + std::to_string(k.ci) +
                                "/" + std::to_string(k.tiling_factor) + "/" + std::to_string(k.mp);
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
  r.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// ---------------------------------------------------------------------------------------------
namespace {

// "does not fit (CPU memory 1.50 TB < 2.05 TB needed per node)" or "fits but gives 30.1 TFLOPS".
std::string outcome(const Evaluated& v, const Evaluated& best) {
  if (!v.fit.fits()) return "does not fit (" + v.fit.binding().sentence() + ")";
  // alternatives are estimated analytically: compare them with the chosen plan's analytic time
  if (v.analytic_score() > best.analytic_score() * (1 + 1e-9))
    return "fits but gives " + fmt_tflops(v.time.tflops_per_gpu) + " per GPU < " + fmt_tflops(best.time.tflops_per_gpu);
  if (v.analytic_score() < best.analytic_score() * (1 - 1e-9))  // only outside the searched space
    return "fits and gives " + fmt_tflops(v.time.tflops_per_gpu) + " per GPU > " + fmt_tflops(best.time.tflops_per_gpu);
  return "fits and gives the same " + fmt_tflops(v.time.tflops_per_gpu) +
         " per GPU (ties go to less traffic, less tiling, less GPU memory)";
}

Evaluated with_config(const ModelSpec& m, const HardwareProfile& p, const Evaluated& base, const FitOptions& o,
                      const std::function<void(Candidate&)>& change) {
  Candidate c = base.candidate;
  change(c);
  return evaluate(m, c, p, o);
}

}  // namespace

std::vector<std::string> explain(const ModelSpec& m, const HardwareProfile& p, const SearchSpace& space,
                                 const Evaluated& best, const SearchOptions& o) {
  std::vector<std::string> out;
  const Candidate& c = best.candidate;
  const TrainingConfig& k = c.config;

  // ---- per state: why this tier and not a faster one ----
  for (State s : {State::optim32, State::grad16, State::param16, State::act_ckpt}) {
    const Tier t = c.placement.of(s).tier;
    std::string line = std::string(state_words(s)) + " on " + tier_words(t);
    if (t == Tier::gpu) {
      const LimitCheck& g = best.fit.checks.front();
      line += c.placement.of(s).partitioned ? " (partitioned 1/" + std::to_string(k.dp) + ")" : "";
      line += ": fits, " + g.sentence();
      out.push_back(line);
      continue;
    }
    std::vector<std::string> why;
    for (Tier f : {Tier::gpu, Tier::cpu}) {
      if (int(f) >= int(t)) continue;  // only the faster tiers
      bool moved_along = false;
      Evaluated v = with_config(m, p, best, o.fit, [&](Candidate& x) {
        Placement& q = x.placement;
        q.of(s).tier = f;
        q.name = "variant";
        // Gradients stay on the GPU or go where the optimizer runs (validate()): moving the
        // optimizer states up moves offloaded gradients along.
        if (s == State::optim32 && q.grad16.tier != Tier::gpu && q.grad16.tier != f) {
          q.grad16.tier = f;
          moved_along = true;
        }
      });
      const std::string along = moved_along ? " (gradients moved along)" : "";
      Result<Placement> ok = validate(v.candidate.placement);
      if (!ok) {
        std::string reason = ok.error();
        if (auto colon = reason.find(": "); colon != std::string::npos) reason = reason.substr(colon + 2);
        why.push_back(std::string("not ") + tier_words(f) + ": placement rule, " + reason);
      } else if (!v.fit.fits()) {
        why.push_back(v.fit.binding().sentence() + " with them on " + tier_words(f) + along);
      } else {
        why.push_back(std::string("on ") + tier_words(f) + along + " it " + outcome(v, best));
      }
    }
    for (size_t i = 0; i < why.size(); ++i) line += (i == 0 ? ": " : "; ") + why[i];
    out.push_back(line);
  }

  // ---- bsz, ci, tiling, mp: one change at a time, the rest as chosen ----
  out.push_back("each alternative below changes one thing, the rest as chosen:");
  auto next_in = [](const auto& list, auto value) -> std::optional<std::decay_t<decltype(value)>> {
    for (auto x : list)
      if (x > value) return x;
    return std::nullopt;
  };
  auto prev_in = [](const auto& list, auto value) -> std::optional<std::decay_t<decltype(value)>> {
    std::optional<std::decay_t<decltype(value)>> r;
    for (auto x : list)
      if (x < value) r = x;
    return r;
  };
  if (auto nb = next_in(space.bsz, k.bsz)) {
    Evaluated v = with_config(m, p, best, o.fit, [&](Candidate& x) { x.config.bsz = *nb; });
    out.push_back("bsz " + format_g(k.bsz) + ": bsz " + format_g(*nb) + " " + outcome(v, best));
  } else {
    out.push_back("bsz " + format_g(k.bsz) + ": the largest the search tries");
  }
  {
    std::string line = "ci " + std::to_string(k.ci) + ":";
    if (auto pc = prev_in(space.ci, k.ci)) {
      Evaluated v = with_config(m, p, best, o.fit, [&](Candidate& x) { x.config.ci = *pc; });
      line += " ci " + std::to_string(*pc) + " " + outcome(v, best) + ";";
    }
    if (auto nc = next_in(space.ci, k.ci)) {
      Evaluated v = with_config(m, p, best, o.fit, [&](Candidate& x) { x.config.ci = *nc; });
      line += " ci " + std::to_string(*nc) + " " + outcome(v, best);
    }
    if (line.back() == ';') line.pop_back();
    if (line.back() != ':') out.push_back(line);
  }
  if (k.tiling_factor > 1) {
    auto pt = prev_in(space.tiling, k.tiling_factor);
    Evaluated v = with_config(m, p, best, o.fit, [&](Candidate& x) { x.config.tiling_factor = pt ? *pt : 1; });
    out.push_back("tiling factor " + std::to_string(k.tiling_factor) + ": tiling " + std::to_string(pt ? *pt : 1) + " " +
                  outcome(v, best));
  } else {
    out.push_back("tiling factor 1: the largest operator's working memory (MSWM, Eq. 4) fits untiled");
  }
  if (k.mp > 1) {
    Evaluated v = with_config(m, p, best, o.fit, [&](Candidate& x) {
      x.config.mp = k.mp / 2;
      x.config.dp = p.total_gpus() / x.config.mp;
    });
    out.push_back("mp " + std::to_string(k.mp) + ": mp " + std::to_string(k.mp / 2) + " " + outcome(v, best));
  }

  {
    // the optimizer overlap: each other one this placement allows, searched or not
    std::string line = std::string("optimizer overlap ") + to_string(k.optimizer_overlap) + ":";
    for (OptimizerOverlap ov : {OptimizerOverlap::none, OptimizerOverlap::backward, OptimizerOverlap::dpu}) {
      if (ov == k.optimizer_overlap) continue;
      if (!check_optimizer_overlap(c.placement, ov)) continue;  // not with this placement
      Evaluated v = with_config(m, p, best, o.fit, [&](Candidate& x) { x.config.optimizer_overlap = ov; });
      const bool searched = std::find(space.overlaps.begin(), space.overlaps.end(), ov) != space.overlaps.end();
      line += std::string(" ") + to_string(ov) + " " + outcome(v, best) +
              (searched ? "" : " (not searched: one step stale, it changes the training dynamics; --allow-dpu)") + ";";
    }
    if (line.back() == ';') line.pop_back();
    if (line.back() != ':') out.push_back(line);
  }

  // ---- the placement order of the paper's evaluation (seed 001), checked on this plan ----
  const Placement& pl = c.placement;
  const bool any_off = pl.param16.tier != Tier::gpu || pl.grad16.tier != Tier::gpu || pl.optim32.tier != Tier::gpu ||
                       pl.act_ckpt.tier != Tier::gpu;
  if (!any_off) {
    out.push_back("placement order: nothing offloaded, every state fits on the GPUs");
    return out;
  }
  Evaluated all_gpu = with_config(m, p, best, o.fit, [&](Candidate& x) {
    x.placement = *preset("zero3");
    x.config.tiling_factor = space.tiling.back();
  });
  out.push_back("placement order: offloaded because GPU memory is short: with every state on GPU (ZeRO-3, tiling " +
                std::to_string(space.tiling.back()) + ") it " + outcome(all_gpu, best));
  const bool optim_first = int(pl.optim32.tier) >= int(pl.param16.tier) && int(pl.grad16.tier) >= int(pl.param16.tier);
  out.push_back(std::string("placement order: optimizer states and gradients left the GPU first: ") +
                (optim_first ? "yes" : "no") + " (optim32 on " + tier_words(pl.optim32.tier) + ", grad16 on " +
                tier_words(pl.grad16.tier) + ", param16 on " + tier_words(pl.param16.tier) + ")");
  const bool params_off = pl.param16.tier != Tier::gpu, ckpt_off = pl.act_ckpt.tier != Tier::gpu;
  if (params_off && ckpt_off) {
    out.push_back(std::string("placement order: parameters and checkpoints both left the GPU: checkpoints on ") +
                  tier_words(pl.act_ckpt.tier) + ", parameters on " + tier_words(pl.param16.tier) +
                  " (the fastest tier with room, see above)");
  } else if (params_off || ckpt_off) {
    Evaluated swap = with_config(m, p, best, o.fit, [&](Candidate& x) {
      x.placement.name = "variant";
      if (params_off) {
        x.placement.param16 = {Tier::gpu, true};
        x.placement.act_ckpt = {Tier::cpu, false};
      } else {
        x.placement.param16 = {x.placement.optim32.tier, true};
        x.placement.grad16.partitioned = x.placement.optim32.partitioned = true;
        x.placement.act_ckpt = {Tier::gpu, false};
      }
    });
    std::string other = params_off ? "keeping parameters on GPU and moving checkpoints to CPU" :
                                     "keeping checkpoints on GPU and moving parameters to " +
                                         std::string(tier_words(pl.optim32.tier));
    std::string res = validate(swap.candidate.placement) ? outcome(swap, best) : "is not a valid placement";
    out.push_back(std::string("placement order: only ") + (params_off ? "parameters" : "checkpoints") +
                  " left the GPU, the faster choice: " + other + " " + res);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
std::string shortfall_advice(const ModelSpec& m, const HardwareProfile& p, const Fixes& fixes,
                             const SearchResult& result, const SearchOptions& o) {
  if (!result.closest) return "no candidate to measure the shortfall against";
  const Evaluated& c = *result.closest;
  std::vector<const LimitCheck*> failing;
  for (const LimitCheck& lc : c.fit.checks)
    if (!lc.fits()) failing.push_back(&lc);
  std::sort(failing.begin(), failing.end(), [](const LimitCheck* a, const LimitCheck* b) { return a->use() > b->use(); });
  std::string need;
  for (const LimitCheck* plc : failing) {
    const LimitCheck& lc = *plc;
    const bool gpu = lc.scope == std::string("per GPU");
    need += (need.empty() ? "" : " and ") + (gpu ? format_bytes(lc.shortfall_bytes()) : format_bytes_decimal(lc.shortfall_bytes())) +
            " more " + to_string(lc.resource) + " " + lc.scope + " (" + lc.sentence() + ")";
  }
  std::string msg = "needs " + need + " with " + placement_label(c.candidate.placement) + ", bsz " +
                    format_g(c.candidate.config.bsz) + ", ci " + std::to_string(c.candidate.config.ci) + ", tiling " +
                    std::to_string(c.candidate.config.tiling_factor);
  if (p.inter_node_Bps <= 0) return msg + "; the profile cannot be scaled to more nodes (no links.inter_node)";
  // More nodes: the smallest count at which anything fits (bsz at its minimum: fit grows with bsz).
  Fixes f = fixes;
  if (!f.bsz) f.bsz = 1;
  SearchOptions so = o;
  so.refine = nullptr;
  auto fits_at = [&](int nodes) {
    Result<HardwareProfile> scaled = scale_to_nodes(p, nodes);
    if (!scaled) return false;
    Result<SearchSpace> sp = make_space(m, *scaled, f);
    return sp && search(m, *scaled, *sp, so).fits();
  };
  int lo = p.nodes, hi = p.nodes * 2;
  while (hi <= 65536 && !fits_at(hi)) {
    lo = hi;
    hi *= 2;
  }
  if (hi > 65536) return msg + "; no cluster of up to 65536 nodes fits it either";
  while (hi - lo > 1) {
    int mid = lo + (hi - lo) / 2;
    (fits_at(mid) ? hi : lo) = mid;
  }
  return msg + ", or " + std::to_string(hi - p.nodes) + " more node(s) (" + std::to_string(hi) + " in all)";
}

// ---------------------------------------------------------------------------------------------
namespace {

// The best fitting candidate of a small space, or nothing.
std::optional<Evaluated> best_fit(const ModelSpec& m, const HardwareProfile& p, const Fixes& fx, const FitOptions& o,
                                  bool partitioned_params_only = false) {
  Result<SearchSpace> sp = make_space(m, p, fx);
  if (!sp) return std::nullopt;
  if (partitioned_params_only)
    std::erase_if(sp.value().placements, [](const Placement& q) { return !q.param16.partitioned; });
  SearchOptions so;
  so.fit = o;
  so.keep = 1;
  SearchResult r = search(m, p, *sp, so);
  if (!r.fits()) return std::nullopt;
  return r.ranked.front();
}

// Table 4's rows (Fig. 6 / Fig. 11a): the path models grow along. Between two rows layers grow at
// the earlier row's hidden size and heads until the next row's parameter count.
struct Anchor {
  int layers;
  long hidden;
  int heads;
};
constexpr Anchor kTable4[] = {{40, 1536, 16}, {50, 4096, 16}, {64, 4096, 16}, {98, 4096, 32}, {125, 8192, 32}, {128, 25600, 256}};

std::string params_words(double n) { return format_count(n); }
std::string whole(double n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f", n);
  return buf;
}

}  // namespace

Result<MaxModel> max_model_size(const std::string& strategy, const HardwareProfile& p, const FitOptions& o) {
  Result<Placement> pre = preset(strategy);
  if (!pre) return make_error(pre.error());
  if (strategy == "l2l") return make_error("--strategy l2l: the planner does not model the layer-major l2l schedule");
  Fixes fx;
  fx.strategy = strategy;
  fx.bsz = 1;
  fx.mp = strategy == "three_d" ? 4 : 1;
  MaxModel best;
  best.strategy = strategy;
  auto fits = [&](int layers, const Anchor& a) -> std::optional<Evaluated> {
    Result<ModelSpec> m = model_from_shape(layers, a.hidden, a.heads);
    if (!m) return std::nullopt;
    return best_fit(*m, p, fx, o);
  };
  const int segments = int(std::size(kTable4));
  int seg = 0, layers = 0;  // the last model on the path that fits
  for (int i = 0; i < segments; ++i) {
    const Anchor& a = kTable4[i];
    const int start = i == 0 ? 1 : a.layers;
    // Last layer count of this segment: just below the next row's parameter count.
    const int end = i + 1 < segments
                        ? int(params_eq1(kTable4[i + 1].layers, kTable4[i + 1].hidden) / params_eq1(1, a.hidden) - 1e-9)
                        : (1 << 22);
    if (!fits(start, a)) break;
    int lo = start, hi = start + 1;
    while (hi <= end && fits(hi, a)) {
      lo = hi;
      hi = std::min(end + 1, start + 2 * (hi - start) + 1);
    }
    if (hi > end) hi = end + 1;
    while (hi - lo > 1) {
      const int mid = lo + (hi - lo) / 2;
      (fits(mid, a) ? lo : hi) = mid;
    }
    seg = i;
    layers = lo;
    if (lo < end) break;  // the path stops inside this segment
  }
  if (layers == 0) return make_error(strategy + ": not even a one-layer model of hidden 1536 fits on " + p.name);
  const Anchor& a = kTable4[seg];
  best.layers = layers;
  best.hidden = a.hidden;
  best.heads = a.heads;
  best.max_params = params_eq1(layers, a.hidden);
  best.plan = *fits(layers, a);
  // Why the path stops: the closest candidate of the next model on it.
  if (Result<ModelSpec> next = model_from_shape(layers + 1, a.hidden, a.heads))
    if (Result<SearchSpace> sp = make_space(*next, p, fx)) {
      SearchOptions so;
      so.fit = o;
      SearchResult r = search(*next, p, *sp, so);
      if (!r.fits() && r.closest) best.stops_because = r.closest->fit.binding().sentence();
    }
  return best;
}

MaxHidden max_hidden_size(int tiling, const HardwareProfile& p, const FitOptions& o) {
  Fixes fx;
  fx.bsz = 1;
  fx.mp = 1;
  fx.tiling = tiling;
  fx.ci = 1;
  MaxHidden r;
  r.tiling = tiling;
  auto fits = [&](long hidden) -> std::optional<Evaluated> {
    Result<ModelSpec> m = model_from_shape(1, hidden, 16);
    if (!m) return std::nullopt;
    return best_fit(*m, p, fx, o, true);
  };
  for (long k = 1; k <= 256; ++k)  // fit is monotone in hidden: stop at the first miss
    if (auto e = fits(k * 1024)) {
      r.hidden = k * 1024;
      r.plan = *e;
    } else {
      break;
    }
  for (long h = 1024; h <= 256 * 1024; h *= 2)
    if (fits(h)) r.hidden_pow2 = h;
  return r;
}

Result<Reproduction> reproduce_fig6(const HardwareProfile& p) {
  struct Row {
    const char* strategy;
    double paper;
    const char* source;
  };
  const Row rows[] = {
      {"data_parallel", 1.4e9, "Table 4 / Sec. 8.5: 1.4B"},
      {"zero2", 10e9, "Table 4: 10B (Sec. 8.5 text: 13B with ZeRO-Offload)"},
      {"zero_offload", 13e9, "Table 4 / Sec. 8.5: 13B"},
      {"three_d", 20e9, "Table 4: 20B (3D Par., mp 4)"},
      {"zero3", 20e9, "Table 4: 20B (ZeRO-3)"},
      {"zero_inf_cpu", 70e9, "Table 4: 70B (Sec. 8.5: almost 100B)"},
      {"zero_inf_nvme", 1000e9, "Table 4 / Sec. 8.5: 1T"},
  };
  std::ostringstream csv, md;
  csv << "strategy,paper_params,memwall_params,layers,hidden,heads,ratio,agrees,stops_because\n";
  md << "# Fig. 6: largest model per strategy on one " << p.name << " (" << p.total_gpus() << " GPUs)\n\n"
     << "Models grown as in Table 4: along Table 4's rows (40 x 1536, 50 x 4096, 64 x 4096, 98 x 4096, 125 x 8192, "
        "128 x 25600), layers grow at one row's hidden size until the next row's size, then the next row takes over, "
        "until nothing fits (bsz 1 per GPU, mp 1, or 4 for three_d; ci, tiling and the checkpoint tier searched). "
        "Parameters counted by Eq. 1 (12 nl hd^2), as the paper does. Agreement: memwall within a factor 1.5 of "
        "the paper.\n\n"
     << "| strategy | paper | memwall | layers x hidden | memwall / paper | agrees | the next layer does not fit because |\n"
     << "|---|---|---|---|---|---|---|\n";
  for (const Row& row : rows) {
    Result<MaxModel> mm = max_model_size(row.strategy, p);
    if (!mm) return make_error(mm.error());
    const std::string why = mm->stops_because.empty() ? "-" : mm->stops_because;
    const double ratio = mm->max_params / row.paper;
    const bool agrees = ratio >= 1 / 1.5 && ratio <= 1.5;
    csv << row.strategy << "," << whole(row.paper) << "," << whole(mm->max_params) << "," << mm->layers << "," << mm->hidden << ","
        << mm->heads << "," << format_sig(ratio, 3) << "," << (agrees ? "yes" : "no") << "," << csv_field(why) << "\n";
    md << "| " << row.strategy << " | " << params_words(row.paper) << " (" << row.source << ") | "
       << params_words(mm->max_params) << " | " << mm->layers << " x " << mm->hidden << " | " << format_sig(ratio, 3)
       << " | " << (agrees ? "yes" : "**no**") << " | " << why << " |\n";
  }
  md << "\nThree_d is modelled as tensor slicing (mp 4) only: memwall has no pipeline dimension, which the "
        "paper's 3D-parallel baseline also used, so it falls short there. Where a row says **no**, memwall's memory "
        "accounting and the paper disagree; the constants were not tuned to hide it.\n";
  return Reproduction{csv.str(), md.str()};
}

Result<Reproduction> reproduce_fig7(const HardwareProfile& p, double max_alloc_bytes) {
  FitOptions o;
  o.max_alloc_bytes = max_alloc_bytes;
  std::ostringstream csv, md;
  csv << "tiling,paper_hidden,memwall_hidden_1k_grid,memwall_hidden_pow2,agrees,stops_because\n";
  md << "# Fig. 7: largest hidden size of a one-layer model, GPU memory pre-fragmented into "
     << format_bytes(max_alloc_bytes) << " chunks, one " << p.name << "\n\n"
     << "A one-layer model (16 heads, bsz 1, parameters partitioned: the ZeRO-3 family with any offload) fits "
        "when every GPU tier check passes and no single tensor of the transformer block exceeds the chunk: the "
        "fc1 weight tile (Eq. 4's operator, 2 x hd x 4hd bytes / tiling), the fc1 output and the attention "
        "scores. Hidden sizes searched on a 1K grid and on the paper's power-of-two grid (Table 5).\n\n"
     << "| tiling factor | paper | memwall (1K grid) | memwall (8K, 16K, 32K, 64K...) | agrees | the next size does not fit because |\n"
     << "|---|---|---|---|---|---|\n";
  for (int t : {1, 2, 4, 8, 16}) {
    MaxHidden mh = max_hidden_size(t, p, o);
    const long paper = t == 1 ? 8192 : t == 16 ? 65536 : 0;
    std::string agrees = paper == 0 ? "-" : (mh.hidden_pow2 == paper ? "yes" : "no");
    std::string why = "-";
    if (Result<ModelSpec> next = model_from_shape(1, mh.hidden_pow2 * 2, 16)) {
      Fixes fx;
      fx.bsz = 1;
      fx.mp = 1;
      fx.tiling = t;
      fx.ci = 1;
      if (Result<SearchSpace> sp = make_space(*next, p, fx)) {
        std::erase_if(sp.value().placements, [](const Placement& q) { return !q.param16.partitioned; });
        SearchOptions so;
        so.fit = o;
        SearchResult r = search(*next, p, *sp, so);
        if (!r.fits() && r.closest)
          why = "hidden " + std::to_string(mh.hidden_pow2 * 2 / 1024) + "K: " + r.closest->fit.binding().sentence();
      }
    }
    csv << t << "," << (paper ? std::to_string(paper) : "") << "," << mh.hidden << "," << mh.hidden_pow2 << ","
        << agrees << "," << csv_field(why) << "\n";
    md << "| " << t << " | " << (paper ? std::to_string(paper / 1024) + "K" : "not reported") << " | "
       << mh.hidden / 1024 << "K | " << mh.hidden_pow2 / 1024 << "K | " << (agrees == "no" ? "**no**" : agrees)
       << " | " << why << " |\n";
  }
  md << "\nThe paper's two numbers meet at the same boundary: the fc1 weight of hidden 16K untiled and of hidden "
        "64K in 16 tiles are both exactly 2 GiB (2 x hd x 4hd / tiling bytes). No allocation model that depends "
        "only on tensor sizes can reject the first and accept the second; memwall accepts a tensor equal to the "
        "chunk, so it agrees at tiling 16 and disagrees without tiling (the paper's 16K failure must come from an "
        "allocation memwall does not model).\n";
  return Reproduction{csv.str(), md.str()};
}

}  // namespace memwall::planner
