#include "planner/explain.hpp"

#include <algorithm>
#include <functional>

#include "model/schedule.hpp"
#include "model/units.hpp"

namespace memwall::planner {
namespace {

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

std::string fmt_tflops(double t) { return format_sig(t, 3) + " TFLOPS"; }

// "does not fit (CPU memory 1.50 TB < 2.05 TB needed per node)" or "fits but gives 30.1 TFLOPS".
// With a global batch an alternative may use another number of GPUs: then TFLOPS per GPU do not
// rank them, samples per second do ("fits but gives 11.4 samples/s on 12 GPUs < 15.2 on 16").
// An alternative the detailed check has refused already (`refused`: its reason) does not fit, whatever
// the analytic fit says.
std::string outcome(const Evaluated& v, const Evaluated& best, const Refused& refused) {
  if (!v.fit.fits()) return "does not fit (" + v.fit.binding().sentence() + ")";
  if (refused)
    if (std::string why = refused(v.candidate); !why.empty()) return "fits the analytic model but " + why;
  const long gv = long(v.candidate.config.dp) * v.candidate.config.mp;
  const long gb = long(best.candidate.config.dp) * best.candidate.config.mp;
  if (gv != gb) {
    const std::string a = format_sig(v.time.samples_per_s, 3) + " samples/s on " + std::to_string(gv) + " GPUs";
    const std::string b = format_sig(best.time.samples_per_s, 3) + " on " + std::to_string(gb);
    return v.analytic_score() > best.analytic_score() ? "fits but gives " + a + " < " + b : "fits and gives " + a + " >= " + b;
  }
  // alternatives are estimated analytically: compare them with the chosen plan's analytic time
  if (v.analytic_score() > best.analytic_score() * (1 + 1e-9))
    return "fits but gives " + fmt_tflops(v.time.tflops_per_gpu) + " per GPU < " + fmt_tflops(best.time.tflops_per_gpu);
  if (v.analytic_score() < best.analytic_score() * (1 - 1e-9))  // only outside the searched space
    return "fits and gives " + fmt_tflops(v.time.tflops_per_gpu) + " per GPU > " + fmt_tflops(best.time.tflops_per_gpu);
  return "fits and gives the same " + fmt_tflops(v.time.tflops_per_gpu) +
         " per GPU (ties go to less traffic, less tiling, the optimizer after backward, less GPU memory)";
}

// `base` with one thing changed; with a global batch, dp and the accumulation are split again for
// the changed micro-batch or slicing, so the alternative trains the same samples per step.
Evaluated with_config(const ModelSpec& m, const HardwareProfile& p, std::optional<long> global, const Evaluated& base,
                      const FitOptions& o, const std::function<void(Candidate&)>& change) {
  Candidate c = base.candidate;
  change(c);
  if (global)
    if (auto split = split_global_batch(*global, c.config.bsz, p.total_gpus() / (c.config.mp * c.config.pp)))
      std::tie(c.config.dp, c.config.grad_accum) = *split;
  return evaluate(m, c, p, o);
}

}  // namespace

std::vector<std::string> explain(const ModelSpec& m, const HardwareProfile& p, const SearchSpace& space,
                                 const Evaluated& best, const SearchOptions& o, const Refused& refused) {
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
      Evaluated v = with_config(m, p, space.global_batch, best, o.fit, [&](Candidate& x) {
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
        why.push_back(std::string("on ") + tier_words(f) + along + " it " + outcome(v, best, refused));
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
  std::vector<double> bsz_list = space.bsz;  // with a global batch: the micro-batches that divide it
  if (space.global_batch)
    std::erase_if(bsz_list, [&](double b) { return !split_global_batch(*space.global_batch, b, 1); });
  if (auto nb = next_in(bsz_list, k.bsz)) {
    Evaluated v = with_config(m, p, space.global_batch, best, o.fit, [&](Candidate& x) { x.config.bsz = *nb; });
    out.push_back("bsz " + format_g(k.bsz) + ": bsz " + format_g(*nb) + " " + outcome(v, best, refused));
  } else {
    out.push_back("bsz " + format_g(k.bsz) + ": the largest the search tries");
  }
  {
    std::string line = "ci " + std::to_string(k.ci) + ":";
    if (auto pc = prev_in(space.ci, k.ci)) {
      Evaluated v = with_config(m, p, space.global_batch, best, o.fit, [&](Candidate& x) { x.config.ci = *pc; });
      line += " ci " + std::to_string(*pc) + " " + outcome(v, best, refused) + ";";
    }
    if (auto nc = next_in(space.ci, k.ci)) {
      Evaluated v = with_config(m, p, space.global_batch, best, o.fit, [&](Candidate& x) { x.config.ci = *nc; });
      line += " ci " + std::to_string(*nc) + " " + outcome(v, best, refused);
    }
    if (line.back() == ';') line.pop_back();
    if (line.back() != ':') out.push_back(line);
  }
  if (k.tiling_factor > 1) {
    auto pt = prev_in(space.tiling, k.tiling_factor);
    Evaluated v = with_config(m, p, space.global_batch, best, o.fit, [&](Candidate& x) { x.config.tiling_factor = pt ? *pt : 1; });
    out.push_back("tiling factor " + std::to_string(k.tiling_factor) + ": tiling " + std::to_string(pt ? *pt : 1) + " " +
                  outcome(v, best, refused));
  } else {
    out.push_back("tiling factor 1: the largest operator's working memory (MSWM, Eq. 4) fits untiled");
  }
  if (k.mp > 1) {
    Evaluated v = with_config(m, p, space.global_batch, best, o.fit, [&](Candidate& x) {
      x.config.mp = k.mp / 2;
      x.config.dp = p.total_gpus() / (x.config.mp * x.config.pp);
    });
    out.push_back("mp " + std::to_string(k.mp) + ": mp " + std::to_string(k.mp / 2) + " " + outcome(v, best, refused));
  }

  {
    // the optimizer overlap: each other one this placement allows, searched or not
    std::string line = std::string("optimizer overlap ") + to_string(k.optimizer_overlap) + ":";
    for (OptimizerOverlap ov : {OptimizerOverlap::none, OptimizerOverlap::backward, OptimizerOverlap::dpu}) {
      if (ov == k.optimizer_overlap) continue;
      if (!check_optimizer_overlap(c.placement, ov, k.grad_clip)) continue;  // not with this placement or clipping
      Evaluated v = with_config(m, p, space.global_batch, best, o.fit, [&](Candidate& x) { x.config.optimizer_overlap = ov; });
      const bool searched = std::find(space.overlaps.begin(), space.overlaps.end(), ov) != space.overlaps.end();
      line += std::string(" ") + to_string(ov) + " " + outcome(v, best, refused) +
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
  Evaluated all_gpu = with_config(m, p, space.global_batch, best, o.fit, [&](Candidate& x) {
    x.placement = *preset("zero3");
    x.config.tiling_factor = space.tiling.back();
  });
  out.push_back("placement order: offloaded because GPU memory is short: with every state on GPU (ZeRO-3, tiling " +
                std::to_string(space.tiling.back()) + ") it " + outcome(all_gpu, best, refused));
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
    Evaluated swap = with_config(m, p, space.global_batch, best, o.fit, [&](Candidate& x) {
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
    std::string res = validate(swap.candidate.placement) ? outcome(swap, best, refused) : "is not a valid placement";
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

}  // namespace memwall::planner
