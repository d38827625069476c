// Pipeline stages (TrainingConfig::pp): the order of a stage's micro-steps under 1F1B and the
// steps that carry activations and their gradients between neighbour stages.
#include "model/schedule_build.hpp"

namespace memwall::build {

// Gradient accumulation: forward and backward once per micro-step, the optimizer once. A pipeline
// stage runs them 1F1B: (pp - stage - 1) forwards first, then one forward and one backward in
// turn, then the remaining backwards.
std::vector<std::pair<bool, int>> micro_step_order(const Shape& sh) {
  const int warmup = std::min(sh.pp - sh.stage - 1, sh.grad_accum);
  std::vector<std::pair<bool, int>> order;  // (forward?, micro-step)
  for (int u = 0; u < warmup; ++u) order.push_back({true, u});
  for (int j = 0; j < sh.grad_accum - warmup; ++j) {
    order.push_back({true, warmup + j});
    order.push_back({false, j});
  }
  for (int j = sh.grad_accum - warmup; j < sh.grad_accum; ++j) order.push_back({false, j});
  return order;
}

// Stages send their output activations forward and their input gradients back, one (B, T, C)
// tensor per micro-step, split over the tensor slices (Megatron's scatter/gather): with mp > 1
// each slice sends its 1/mp part (the tensor is the same on every slice) and the receiving
// slices all-gather the parts over the mp group. Returns the step after which the tensor is whole.
int p2p(Builder& b, Phase ph, Hop hop, int peer, LinkClass link, std::vector<int> d) {
  const Shape& sh = b.sh;
  const bool recv = hop == Hop::recv;
  const int blk = recv ? (ph == Phase::forward ? sh.blocks.first : sh.blocks.last)
                       : (ph == Phase::forward ? sh.blocks.last : sh.blocks.first);
  const double bytes = sh.z.act_bytes * sh.act_elems() / sh.c.mp;
  Step st = transfer({StepKind::p2p, ph, hop, State::act_ckpt, bytes, Tier::gpu, Tier::gpu, link},
                     "block" + std::to_string(blk) + ".input", std::move(d));
  st.state.reset();
  st.block = blk;
  st.collective = {recv ? CollectiveKind::recv : CollectiveKind::send, CommGroup::pp, 2, peer, bytes};
  const int id = b.e.emit(std::move(st));
  if (!recv || sh.c.mp <= 1) return id;
  Step g = transfer({StepKind::p2p, ph, Hop::mp, State::act_ckpt, bytes * (sh.c.mp - 1), Tier::gpu, Tier::gpu,
                     LinkClass::gpu_gpu},
                    "block" + std::to_string(blk) + ".input", deps({id}));
  g.state.reset();
  g.block = blk;
  g.collective = {CollectiveKind::all_gather, CommGroup::mp, sh.c.mp, -1, bytes};
  return b.e.emit(std::move(g));
}

}  // namespace memwall::build
