// The closed-form analysis of the ZeRO-Infinity paper (seed 000, Sec. 3-4), Eq. 1-11 exactly as
// written there, plus what memwall derives from them: the effective bandwidth each state sees from
// each tier of a hardware profile, which tiers a model fits in, Table 3 and the Fig. 3 sweeps.
// Every formula lives here once; sim/, planner/ and gui/ call these functions instead of
// re-deriving them. Pure functions over value types: thread-safe.
#pragma once

#include <string>
#include <vector>

#include "model/hardware_profile.hpp"
#include "model/model_spec.hpp"
#include "model/training_config.hpp"

namespace memwall {

// ---- Eq. 1-11 (nl layers, hd hidden, bsz micro-batch, seq sequence, ci checkpoint interval) ----
double params_eq1(int nl, long hd);                                            // 12·nl·hd²
double model_state_bytes_eq2(int nl, long hd);                                 // 240·nl·hd²
double act_ckpt_bytes_eq3(double bsz, long seq, long hd, int nl, int ci);      // 2·bsz·seq·hd·nl/ci
double mswm_bytes_eq4(long hd);                                                // 4·hd·4hd
// bsz·seq·ci·(16hd + 2·heads·seq·density): `attention_density` < 1 is seed 004's block-sparse
// attention, which keeps only that share of the score matrices (the 2·heads·seq term).
double awm_bytes_eq5(double bsz, long seq, int ci, long hd, int heads, double attention_density = 1);
double computation_flops_eq7(double bsz, long seq, double params);             // 2·4·bsz·seq·params
double ait_param_grad_eq9(double bsz, long seq);                               // seq·bsz
double ait_optimizer_eq10(double bsz, long seq);                               // seq·bsz/4
double ait_act_ckpt_eq11(long hd, int ci);                                     // 24·hd·ci
double efficiency_eq6(double ait, double bw_Bps, double peak_flops_per_s);     // ait·bw/(ait·bw + peak)
// Eq. 6 solved for bandwidth: what `bw` gives `efficiency` (0 < efficiency < 1).
double bandwidth_for_efficiency(double ait, double efficiency, double peak_flops_per_s);

// ---- The same quantities for any ModelSpec, from its operators (model/operator_graph.hpp) ----
// Each equals its equation above for the paper's GPT (ModelSpec::paper_gpt) and is tested so.
// Every parameter (embeddings, norms and biases included: the graph's param_elems in closed form,
// and what model authors publish); active: those a token passes through (a mixture of experts
// routes each token to some experts only). Analysis::params is Eq. 1 for the paper's GPT and this
// count for any other kind (today's models keep a large share in untied embeddings).
double model_param_count(const ModelSpec& m);
double active_param_count(const ModelSpec& m);
// What the closed-form analysis (Analysis::params, the planner's estimate_time) counts: Eq. 1 for
// the paper's GPT, model_param_count (active_param_count) for any other kind.
double analysis_param_count(const ModelSpec& m, bool active = false);
// Eq. 4 generalised: fp32 gradients of the largest linear layer (one expert's), 4 B x in x out.
double mswm_bytes(const ModelSpec& m);
// Eq. 5 generalised: per token and block, the feed-forward's fp16 intermediates (fc1's outputs and
// the activation's, for each active expert) plus the fp16 score rows of every query head.
double awm_bytes(const ModelSpec& m, double bsz, long seq, int ci, double attention_density = 1);
// Eq. 9-11 generalised: compute counts the weights a token passes through (active experts), the
// bytes every weight; for a dense model the share is 1 and Eq. 9-10 are unchanged. Eq. 11:
// 8 x a block's active linear weights per token over 4·hd checkpoint bytes (written, read) per ci.
double active_weight_share(const ModelSpec& m);
double ait_act_ckpt(const ModelSpec& m, int ci);
// The same with the block's active linear weights given (active_block_weight_elems(m)).
double ait_act_ckpt(const ModelSpec& m, int ci, double block_weights);

// ---- 1-bit Adam (seed 004) ----
// Error feedback: one fp32 per parameter of a rank's optimizer shard, kept beside optim32.
inline constexpr double kOnebitErrorBytes = 4;
// Bytes a gradient collective moves in 1-bit Adam's compression stage when uncompressed it moves
// `bytes` of `elem_bytes`-wide elements in `pieces` pieces: 1 bit per element plus one fp32 scale
// per piece (bf16: bytes / 16 + 4·pieces).
double onebit_bytes(double bytes, double elem_bytes, double pieces);
// End-to-end average over a training run whose first `warmup` share of steps are plain Adam:
// warmup·plain + (1 - warmup)·compressed. With bytes it is the inverse of the blog's volume ratio
// 1 / (warmup + (1 - warmup) / 16); with iteration times, the average iteration.
double onebit_end_to_end(double plain, double compressed, double warmup);

// ---- Effective bandwidth per state and tier on a profile ----
enum class AitState { param_grad, optimizer, act_ckpt };
const char* to_string(AitState s);  // "param_grad", "optimizer", "act_ckpt" (the JSON keys)

struct StateTierEfficiency {
  AitState state;
  std::string tier;   // "gpu", "cpu", "nvme", or "cpu-broadcast" (ZeRO-Offload's one-link read)
  std::string basis;  // how bw_Bps was derived, in words a user can check against the profile
  double bw_Bps = 0;
  double ait = 0;
  double efficiency = 0;
};

// Which bandwidth a state sees from each tier with `dp` data-parallel GPUs (Sec. 4-6):
//  param_grad: bandwidth-centric partitioning reads 1/dp per GPU in parallel and all-gathers, so a
//    GPU receives a full parameter at min(dp x per-GPU slow bandwidth, all-gather bandwidth); the
//    broadcast variant reads through one GPU's PCIe link.
//  optimizer: every rank updates its 1/dp partition at once: the aggregate bandwidth counts.
//  act_ckpt: every GPU saves its own checkpoints: the per-GPU bandwidth with all GPUs active.
std::vector<StateTierEfficiency> tier_efficiencies(const HardwareProfile& profile, const ModelSpec& model,
                                                   const TrainingConfig& config, int dp);

// ---- Memory fit ----
struct TierFit {
  std::string what;  // "model states", "activation checkpoints", "MSWM", "AWM"
  std::string tier;  // "gpu" (one GPU or all GPUs, see scope), "cpu", "nvme"
  std::string scope; // "one GPU", "all GPUs", "all nodes"
  double needed_bytes = 0;
  double capacity_bytes = 0;
  bool fits() const { return needed_bytes <= capacity_bytes; }
};

struct Analysis {
  ModelSpec model;
  TrainingConfig config;
  std::string profile_name;
  int gpus = 0;                  // GPUs the analysis assumes (data-parallel degree x mp)
  double peak_flops_per_s = 0;   // achievable peak for this hidden size
  double params = 0;             // Eq. 1 (model_param_count: every parameter beyond the paper's GPT)
  double active_params = 0;      // per token (a mixture of experts' routed share); = params when dense
  double model_state_bytes = 0;  // Eq. 2: 20 B per parameter
  double act_ckpt_bytes_per_gpu = 0;  // Eq. 3 at the micro-batch of one GPU
  double act_ckpt_bytes_total = 0;    // Eq. 3 over every data-parallel GPU's micro-batch
  double mswm_bytes = 0;         // Eq. 4
  double awm_bytes = 0;          // Eq. 5 (per GPU)
  double computation_flops = 0;  // Eq. 7-8, per GPU per iteration
  double ait_param_grad = 0;     // Eq. 9
  double ait_optimizer = 0;      // Eq. 10
  double ait_act_ckpt = 0;       // Eq. 11
  std::vector<StateTierEfficiency> efficiencies;
  std::vector<TierFit> fits;
};

// `gpus` = 0 means every GPU of the profile. Callers validate `config` and `gpus` first.
Analysis analyze(const ModelSpec& model, const TrainingConfig& config, const HardwareProfile& profile, int gpus);

// ---- Table 3: bandwidth needed to stay efficient on 512 devices of 1x, 10x, 100x V100 compute ----
// GPU-GPU: parameters and gradients at 50 % efficiency with bsz 1 (Sec. 4.2: "70 GB/s").
// Slow memory: every model state (Eq. 2, 20 B/param) read and written once per iteration, which
// cannot overlap compute (Sec. 4.2), at 90 % efficiency with bsz 2: AIT = 8·bsz·seq·P / 40·P.
// The aggregate ("1.5 TB/s", Sec. 4.2) is shared by all devices. `optimizer_only_Bps_per_device`
// is the same requirement from Eq. 10 alone (optimizer states only), shown for comparison.
struct Table3Row {
  double compute_multiplier = 1;
  int devices = 512;
  double peak_flops_per_s = 0;
  double slow_memory_Bps_per_device = 0;
  double slow_memory_aggregate_Bps = 0;
  double optimizer_only_Bps_per_device = 0;
  double gpu_gpu_Bps = 0;
};
std::vector<Table3Row> table3(double v100_peak_flops_per_s = 70e12, long seq = 1024, int devices = 512);

// ---- Fig. 3: efficiency against bandwidth (peak 70 TFLOPS, seq 1024, ci 1) ----
enum class Fig3Panel { a_param_grad, b_optimizer, c_act_ckpt };
struct SweepPoint {
  std::string panel;   // "fig3a", "fig3b", "fig3c"
  std::string series;  // "bsz=4" or "hidden=8192"
  double bsz = 0;
  long hidden = 0;
  double bw_Bps = 0;
  double ait = 0;
  double efficiency = 0;
};
// Bandwidths from 0.1 GB/s to 10 TB/s, 10 points per decade; bsz 1-16 (a, b) or hidden 2K-64K (c).
std::vector<SweepPoint> fig3_sweep(Fig3Panel panel, double peak_flops_per_s = 70e12, long seq = 1024, int ci = 1);
// One curve of a panel on the same grid: bsz for (a) and (b), hidden for (c); the other is ignored.
std::vector<SweepPoint> fig3_series(Fig3Panel panel, double bsz, long hidden, double peak_flops_per_s, long seq, int ci);

}  // namespace memwall
