// Pipeline stages (TrainingConfig::pp): the order of a stage's micro-steps under 1F1B and the
// steps that carry activations and their gradients between neighbour stages.
#include "model/schedule_build.hpp"

namespace memwall::build {

// Stages send their output activations forward and their input gradients back, one (B, T, C)
// tensor per micro-step, split over the tensor slices (Megatron's scatter/gather): with mp > 1
// each slice sends its 1/mp part (the tensor is the same on every slice) and the receiving
// slices all-gather the parts over the mp group. Returns the step after which the tensor is whole.
int p2p(Builder& b, Phase ph, Hop hop, int chunk, std::vector<int> d) {
  const Shape& sh = b.sh;
  const bool recv = hop == Hop::recv;
  const StageBlocks& cb = sh.chunks[size_t(chunk)];
  const int blk = recv ? (ph == Phase::forward ? cb.first : cb.last) : (ph == Phase::forward ? cb.last : cb.first);
  // forward: from the stage before, to the stage after; backward the other way round
  const bool from_prev = (ph == Phase::forward) == recv;
  const int peer = from_prev ? sh.prev_stage() : sh.next_stage();
  const LinkClass link = from_prev ? sh.p2p_prev : sh.p2p_next;
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
