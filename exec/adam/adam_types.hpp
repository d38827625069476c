// The two small enums CPU Adam is parameterised by: element types and instruction sets.
// Deliberately includes nothing: the per-ISA kernel files (compiled with -mavx512f / -mavx2) include
// it, and any inline library code they pulled in could be linked into callers on older CPUs.
// Plain values; thread-safe.
#pragma once

namespace memwall::adam {

enum class DType { fp32, fp16, bf16 };     // fp16 = IEEE binary16, bf16 = bfloat16
enum class Isa { scalar, avx2, avx512 };   // avx2 means AVX2 + FMA + F16C; avx512 means F + BW + VL

// fp32 constants of one Adam step, each rounded from double exactly where torch 1.13 rounds it
// (torch/optim/adam.py, _single_tensor_adam; ATen casts Python scalars to float per op). Made by
// step_scalars() (cpu_adam.hpp) for CpuAdam's kernels and the cuda backend's alike.
struct StepScalars {
  float inv_loss_scale;  // float(1 / loss_scale), as GradScaler computes inv_scale
  float clip_coef;
  bool use_l2;           // Adam with weight_decay != 0: grad = grad.add(param, alpha=wd)
  float l2;              // float(wd)
  bool decoupled;        // AdamW: param.mul_(1 - lr * wd)
  float param_decay;     // float(1 - lr * wd)
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float bias_correction2_sqrt;  // float(sqrt(1 - beta2**step))
  float eps;
  float neg_step_size;          // float(-(lr / (1 - beta1**step)))
};

}  // namespace memwall::adam
