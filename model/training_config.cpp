#include "model/training_config.hpp"

#include "model/units.hpp"

namespace memwall {

Result<TrainingConfig> validate(const TrainingConfig& c, int layers) {
  if (!(c.bsz > 0)) return make_error("--bsz: expected a micro-batch per GPU > 0, got " + format_sig(c.bsz));
  if (c.seq < 1) return make_error("--seq: expected a sequence length >= 1, got " + std::to_string(c.seq));
  if (c.ci < 1 || c.ci > layers)
    return make_error("--ci: expected a checkpoint interval between 1 and the model's " + std::to_string(layers) +
                      " layers, got " + std::to_string(c.ci));
  if (c.tiling_factor < 1)
    return make_error("--tiling: expected a tiling factor >= 1, got " + std::to_string(c.tiling_factor));
  if (c.dp < 0) return make_error("--dp: expected a data-parallel degree >= 1, got " + std::to_string(c.dp));
  if (c.mp < 1) return make_error("--mp: expected a tensor-slicing degree >= 1, got " + std::to_string(c.mp));
  if (c.prefetch_depth < 0)
    return make_error("--prefetch-depth: expected an integer >= 0, got " + std::to_string(c.prefetch_depth));
  if (c.micro_batches < 1)
    return make_error("--micro-batches: expected an integer >= 1, got " + std::to_string(c.micro_batches));
  return c;
}

}  // namespace memwall
