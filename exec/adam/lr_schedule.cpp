#include "exec/adam/lr_schedule.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "model/units.hpp"

namespace memwall::adam {

const char* to_string(LrDecay d) {
  switch (d) {
    case LrDecay::constant: return "constant";
    case LrDecay::linear: return "linear";
    case LrDecay::cosine: return "cosine";
  }
  return "?";
}

Result<LrDecay> parse_lr_decay(const std::string& s) {
  for (LrDecay d : {LrDecay::constant, LrDecay::linear, LrDecay::cosine})
    if (s == to_string(d)) return d;
  return make_error("expected constant, linear or cosine, got \"" + s + "\"");
}

double lr_at(const LrSchedule& s, double lr, long step) {
  if (s.warmup_steps > 0 && step <= s.warmup_steps) return lr * double(step) / double(s.warmup_steps);
  if (s.decay == LrDecay::constant) return lr;
  if (step >= s.decay_steps) return s.min_lr;
  // the share of the decay done: 0 right after the warm-up, 1 at decay_steps
  const double done = double(step - s.warmup_steps) / double(std::max(1L, s.decay_steps - s.warmup_steps));
  const double left = s.decay == LrDecay::linear ? 1 - done : 0.5 * (1 + std::cos(std::numbers::pi * done));
  return s.min_lr + (lr - s.min_lr) * left;
}

std::string describe(const LrSchedule& s) {
  std::string out = to_string(s.decay);
  if (s.decay != LrDecay::constant)
    out += " to " + format_g(s.min_lr) + " at step " + std::to_string(s.decay_steps);
  if (s.warmup_steps > 0) out += ", " + std::to_string(s.warmup_steps) + " warm-up steps";
  return out;
}

}  // namespace memwall::adam
