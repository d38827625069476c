// TrainingConfig: how one iteration is run, independent of where states live: micro-batch per GPU,
// sequence length, checkpoint interval, tiling factor, data- and tensor-parallel degrees, prefetch
// depth. Defaults are the paper's (seq 1024, ci 1, prefetch i+3/i+2/i+1). Value type.
#pragma once

#include <string>

#include "model/result.hpp"

namespace memwall {

struct TrainingConfig {
  double bsz = 1;          // micro-batch per GPU (Table 1 uses 1.25: an average over GPUs)
  long seq = 1024;         // tokens per sample
  int ci = 1;              // transformer blocks between activation checkpoints
  int tiling_factor = 1;   // memory-centric tiling of linear operators (Sec. 5.1.3)
  int dp = 0;              // data-parallel degree; 0 = every GPU not used by mp
  int mp = 1;              // tensor-slicing degree inside a node
  int prefetch_depth = 3;  // nc for op i+3, cg for i+2, gg for i+1 (Sec. 6.2)
  int micro_batches = 1;   // l2l: micro-batches looped inside each layer (seed 002, Sec. 2)
};

// Checks ranges; `layers` bounds ci. Messages name the flag ("--ci: ...").
Result<TrainingConfig> validate(const TrainingConfig& config, int layers);

}  // namespace memwall
