#include "model/op_cost.hpp"

#include <algorithm>
#include <utility>

namespace memwall {

double mp_flops_share(OpKind kind, OpRole role, const TrainingConfig& c) {
  if (kind == OpKind::layernorm) return 1.0;
  if (role == OpRole::embed || role == OpRole::lm_head) return 1.0 / embedding_mp(c);
  return 1.0 / std::max(1, c.mp);
}

double op_step_seconds(const HardwareProfile& p, const ModelSpec& m, const OpStep& s, double peak) {
  if (s.kind == OpKind::linear && (!p.gemm.empty() || p.gpu_sms > 0)) {
    const GemmShape g = linear_gemm_shape(m, s.role, s.tokens, s.mp, s.tiles);
    if (const double rate = g.m > 0 && g.n > 0 && g.k > 0 ? p.gemm_rate(g.m, g.n, g.k) : 0; rate > 0)
      return s.flops / rate;
  }
  if (const KernelRate* k = p.kernel(to_string(s.kind)))
    return k->flops_per_s > 0 ? s.flops / k->flops_per_s : s.bytes / k->bytes_per_s;
  if (p.gpu_memory_Bps <= 0) return s.flops / peak;
  return std::max(s.flops / peak, s.bytes / p.gpu_memory_Bps);
}

OperatorGraph block_graph(const ModelSpec& m, const TrainingConfig& c) {
  // every block is alike: one block and the operators around it stand for the whole model
  ModelSpec one = m;
  one.layers = 1;
  return build_gpt_graph(one, c.bsz, c.seq, c.what_if.attention_density);
}

PassCompute pass_compute(const HardwareProfile& p, const ModelSpec& m, const TrainingConfig& c, double peak) {
  return pass_compute(p, m, c, peak, block_graph(m, c));
}

PassCompute pass_compute(const HardwareProfile& p, const ModelSpec& m, const TrainingConfig& c, double peak,
                         const OperatorGraph& g) {
  PassCompute pc;
  for (size_t v : g.order) {
    const Operator& op = g.op(v);
    const double share = mp_flops_share(op.kind, op.role, c);
    OpStep s{op.kind, op.role, 0, 0, micro_batch_tokens(c), c.mp,
             op.kind == OpKind::linear ? std::max(1, c.tiling_factor) : 1};
    const double fwd_bytes = (op.act_read_bytes + op.act_write_bytes) * share;
    // forward, the recompute of a checkpointed block's forward, backward (twice the bytes)
    const std::pair<double, double> steps[] = {{op.fwd_flops, fwd_bytes}, {op.recompute_flops, fwd_bytes},
                                               {op.bwd_flops, 2 * fwd_bytes}};
    double t = 0;
    std::vector<PassItem>* lists[] = {&pc.forward, &pc.recompute, &pc.backward};
    for (size_t i = 0; i < 3; ++i) {
      if (i == 1 && op.block < 0) continue;  // only the blocks are recomputed
      s.flops = steps[i].first * share;
      s.bytes = steps[i].second;
      const double step_s = op_step_seconds(p, m, s, peak);
      t += step_s;
      if (op.block >= 0)
        for (int tile = 0; tile < s.tiles; ++tile)
          lists[i]->push_back({step_s / s.tiles, op.param_elems * share / s.tiles});
    }
    (op.block >= 0 ? pc.block_s : pc.outer_s) += t;
    if (op.role == OpRole::embed) pc.embed_s += t, pc.embed_param_elems = op.param_elems * share;
  }
  std::reverse(pc.backward.begin(), pc.backward.end());
  for (const PassItem& it : pc.forward) pc.param_groups += it.param_elems > 0;
  return pc;
}

}  // namespace memwall
