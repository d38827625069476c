// What one GPU spends on one compute step of an operator: the one cost that the simulator's
// replay (sim/replay.cpp, every step of a schedule) and the planner's closed form (planner/fit.cpp,
// one block's operators times the blocks) both take, so that `plan` and `simulate` cost the same
// operators alike. Pure functions over value types: thread-safe.
#pragma once

#include <algorithm>
#include <vector>

#include "model/hardware_profile.hpp"
#include "model/model_spec.hpp"
#include "model/operator_graph.hpp"
#include "model/training_config.hpp"

namespace memwall {

// The share of an operator one tensor-slicing rank computes: a norm is replicated, the embedding
// and LM head are split by vocabulary or whole (embedding_mp), the rest split by mp.
double mp_flops_share(OpKind kind, OpRole role, const TrainingConfig& c);

// Tokens of one micro-batch on one GPU (Table 1's 1.25 samples: 1280 tokens of 1024), the M of
// its linear layers' GEMMs.
inline long micro_batch_tokens(const TrainingConfig& c) { return std::max(1L, long(c.bsz * double(c.seq))); }

// One compute step: `flops` of an operator's forward (or recompute) or backward on one tensor slice
// and tile, moving `bytes` of activations through HBM (backward twice its forward's). A linear
// layer's GEMM is linear_gemm_shape(m, role, tokens, mp, tiles).
struct OpStep {
  OpKind kind = OpKind::linear;
  OpRole role = OpRole::qkv;
  double flops = 0, bytes = 0;
  long tokens = 0;
  int mp = 1, tiles = 1;
};

// Seconds at the profile's rates, `peak` being its peak for the model (peak_flops_per_s(hidden)):
// a linear layer at its GEMM shape's rate (gpu.gemm measured by `memwall calibrate`, or a datasheet
// profile's tile and wave model over gpu.sms); an operator kind `calibrate` measured (gpu.kernels)
// at that rate; else the longer of its FLOPs at the peak and its bytes through HBM (LayerNorm,
// GeLU, residual adds and the embedding are bound by the bytes).
double op_step_seconds(const HardwareProfile& p, const ModelSpec& m, const OpStep& s, double peak);

// Adam on the GPU over `params` parameters of one rank: its kAdamBytesPerParam (fp32 master copy,
// momentum and variance read and written, the fp32 gradient read, the 16-bit copy written) through HBM;
// 0 where the profile gives no HBM bandwidth. The replay's optimizer step on the GPU and the
// planner's optimizer time.
inline double gpu_adam_seconds(const HardwareProfile& p, double params) {
  return p.gpu_memory_Bps > 0 ? params * kAdamBytesPerParam / p.gpu_memory_Bps : 0;
}

// One micro-step's compute on one tensor slice of one GPU, every operator's forward, recompute and
// backward as the schedule emits them (mp_flops_share, tiles), at op_step_seconds: one
// transformer block, and the operators outside the blocks (embedding, final norm, LM head). The
// planner's compute time.
// One compute item of a block in the order a pass runs it (forward and recompute in graph order,
// backward reversed; a tiled operator's tiles one after another, as Shape::items_of lists them):
// its seconds and the parameters (one tensor slice, one tile) it fetches, 0 for an operator without.
struct PassItem {
  double seconds = 0;
  double param_elems = 0;
};
struct PassCompute {
  double block_s = 0;
  double outer_s = 0;
  double embed_s = 0;  // of outer_s, the embedding's (a pipeline's first stage; the rest on its last)
  double embed_param_elems = 0;  // the embedding's, one tensor slice: the first fetch of a forward
  std::vector<PassItem> forward, recompute, backward;  // one block's items, pass by pass
  int param_groups = 0;  // of a pass's items, those with parameters (each tile its own)
};
PassCompute pass_compute(const HardwareProfile& p, const ModelSpec& m, const TrainingConfig& c, double peak);
// The same over `block`, block_graph(m, c): one block and the operators around it (its FLOPs and
// bytes depend on the micro-batch, sequence and attention density only, so callers that cost many
// slicings and tilings build it once).
OperatorGraph block_graph(const ModelSpec& m, const TrainingConfig& c);
PassCompute pass_compute(const HardwareProfile& p, const ModelSpec& m, const TrainingConfig& c, double peak,
                         const OperatorGraph& block);

}  // namespace memwall
