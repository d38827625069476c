#include "cli/fix_flags.hpp"

#include <charconv>
#include <map>
#include <optional>

#include "model/units.hpp"

namespace memwall::cli {
namespace {

std::optional<State> state_named(const std::string& s) {
  for (State st : kAllStates)
    if (s == to_string(st)) return st;
  return std::nullopt;
}

Result<int> parse_int(const std::string& key, const std::string& v, int min_value, int max_value) {
  int x = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  if (ec != std::errc() || end != v.data() + v.size() || x < min_value || x > max_value)
    return make_error("--fix " + key + ": expected an integer from " + std::to_string(min_value) + " to " +
                      std::to_string(max_value) + ", got \"" + v + "\"");
  return x;
}

}  // namespace

Result<planner::Fixes> parse_fixes(const std::vector<std::string>& key_values) {
  planner::Fixes f;
  std::map<std::string, std::string> seen;
  const std::string keys =
      "strategy, param16, grad16, optim32, act_ckpt, fetch, bsz, ci, tiling, mp, pp, virtual_stages, ep, prefetch_depth, "
      "optimizer_overlap";
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
    } else if (key == "ci" || key == "tiling" || key == "mp" || key == "pp" || key == "virtual_stages" || key == "ep" ||
               key == "prefetch_depth") {
      const int most = key == "ci"       ? kMaxLayers
                       : key == "tiling" ? kMaxTiling
                       : key == "mp"     ? kMaxMp
                       : key == "pp" || key == "virtual_stages" ? kMaxPp
                       : key == "ep"     ? kMaxExperts
                                         : kMaxPrefetchDepth;
      Result<int> x = parse_int(key, value, key == "prefetch_depth" ? 0 : 1, most);
      if (!x) return make_error(x.error());
      (key == "ci"       ? f.ci
       : key == "tiling" ? f.tiling
       : key == "mp"     ? f.mp
       : key == "pp"     ? f.pp
       : key == "virtual_stages" ? f.virtual_stages
       : key == "ep"     ? f.ep
                         : f.prefetch_depth) = *x;
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

}  // namespace memwall::cli
