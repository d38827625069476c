// The learning rate of each optimizer step: a linear warm-up from 0, then constant or a linear or
// cosine decay to a floor, as Megatron-LM's --lr-decay-style, --lr-warmup-iters, --lr-decay-iters
// and --min-lr describe it. One function, used by every Adam (CPU and device) the engine runs.
// Value type and pure function: thread-safe.
#pragma once

#include <string>

#include "model/result.hpp"

namespace memwall::adam {

enum class LrDecay { constant, linear, cosine };
const char* to_string(LrDecay d);
Result<LrDecay> parse_lr_decay(const std::string& s);  // "constant", "linear", "cosine"

struct LrSchedule {
  LrDecay decay = LrDecay::constant;
  long warmup_steps = 0;  // steps 1..warmup: lr x step / warmup
  long decay_steps = 0;   // the step the decay reaches min_lr (counted from step 0, warm-up included)
  double min_lr = 0;      // the floor of a decay
};

// The rate of optimizer step `step` (1-based, Adam's step number) for peak rate `lr`.
double lr_at(const LrSchedule& s, double lr, long step);

// "constant", "cosine to 1e-05 over 300 steps after 30 warm-up steps", ...: for run headers.
std::string describe(const LrSchedule& s);

}  // namespace memwall::adam
