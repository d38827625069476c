#include "exec/adam/cpu_adam.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <sstream>
#include <system_error>
#include <thread>

#include "exec/adam/adam_kernels.hpp"
#include "exec/adam/host_cores.hpp"
#include "exec/adam/worker_pool.hpp"

#if MEMWALL_ADAM_X86
#include <cpuid.h>
#endif

namespace memwall::adam {
namespace {

// Below this many elements per thread, waking another thread costs more than it saves.
constexpr std::size_t kMinPerThread = 16 * 1024;
// Thread ranges start on multiples of this (64 elements = 256 B of fp32, 128 B of 16-bit copy),
// so no two threads write the same cache line.
constexpr std::size_t kSplitAlign = 64;

std::string fmt(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

std::optional<detail::KernelTable> kernels_for(Isa isa) {
  switch (isa) {
    case Isa::scalar: return detail::scalar_kernels();
#if MEMWALL_ADAM_X86
    case Isa::avx2: return detail::avx2_kernels();
    case Isa::avx512: return detail::avx512_kernels();
#else
    default: break;
#endif
  }
  return std::nullopt;
}

Result<int> check_options(const AdamOptions& o, int threads) {
  auto bad = [](const char* field, const char* want, double got) {
    return make_error(std::string("adam: ") + field + ": expected " + want + ", got " + fmt(got));
  };
  if (!(o.lr >= 0 && std::isfinite(o.lr))) return bad("lr", "a finite value >= 0", o.lr);
  if (!(o.beta1 >= 0 && o.beta1 < 1)) return bad("beta1", "a value in [0, 1)", o.beta1);
  if (!(o.beta2 >= 0 && o.beta2 < 1)) return bad("beta2", "a value in [0, 1)", o.beta2);
  if (!(o.eps >= 0 && std::isfinite(o.eps))) return bad("eps", "a finite value >= 0", o.eps);
  if (!(o.weight_decay >= 0 && std::isfinite(o.weight_decay)))
    return bad("weight_decay", "a finite value >= 0", o.weight_decay);
  if (threads < 0) return bad("threads", "0 (every core this process may use) or more", threads);
  if (threads == 0) threads = cores_allowed().quota_cores;
  return threads;
}

}  // namespace

// Python float arithmetic (double) first, then the cast ATen applies when the scalar meets a
// float tensor; see torch/optim/adam.py and adamw.py.
StepScalars step_scalars(const AdamOptions& o, long step, const GradScaling& g) {
  const double bias_correction1 = 1 - std::pow(o.beta1, static_cast<double>(step));
  const double bias_correction2 = 1 - std::pow(o.beta2, static_cast<double>(step));
  const double step_size = o.lr / bias_correction1;
  StepScalars s{};
  s.inv_loss_scale = static_cast<float>(1.0 / g.loss_scale);
  s.clip_coef = static_cast<float>(g.clip_coef);
  s.use_l2 = !o.decoupled_weight_decay && o.weight_decay != 0;
  s.l2 = static_cast<float>(o.weight_decay);
  s.decoupled = o.decoupled_weight_decay;
  s.param_decay = static_cast<float>(1 - o.lr * o.weight_decay);
  s.beta1 = static_cast<float>(o.beta1);
  s.one_minus_beta1 = static_cast<float>(1 - o.beta1);
  s.beta2 = static_cast<float>(o.beta2);
  s.one_minus_beta2 = static_cast<float>(1 - o.beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(o.eps);
  s.neg_step_size = static_cast<float>(-step_size);
  return s;
}

namespace {

// [begin, end) of thread t out of `used`, on kSplitAlign boundaries.
std::pair<std::size_t, std::size_t> thread_range(std::size_t n, int used, int t) {
  const std::size_t blocks = (n + kSplitAlign - 1) / kSplitAlign;
  const std::size_t per = blocks / used, extra = blocks % used;
  const std::size_t ut = static_cast<std::size_t>(t);
  const std::size_t b0 = ut * per + std::min(ut, extra);
  const std::size_t b1 = b0 + per + (ut < extra ? 1 : 0);
  return {std::min(n, b0 * kSplitAlign), std::min(n, b1 * kSplitAlign)};
}

int threads_for(std::size_t n, int pool_size) {
  const std::size_t want = std::max<std::size_t>(1, n / kMinPerThread);
  return static_cast<int>(std::min<std::size_t>(want, static_cast<std::size_t>(pool_size)));
}

}  // namespace

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

Result<Isa> parse_isa(std::string_view s) {
  for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512})
    if (s == isa_name(i)) return i;
  return make_error("expected scalar, avx2 or avx512, got \"" + std::string(s) + "\"");
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::fp32: return "fp32";
    case DType::fp16: return "fp16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

Result<DType> parse_dtype(std::string_view s) {
  for (DType t : {DType::fp32, DType::fp16, DType::bf16})
    if (s == dtype_name(t)) return t;
  return make_error("expected fp32, fp16 or bf16, got \"" + std::string(s) + "\"");
}

std::size_t dtype_bytes(DType t) { return t == DType::fp32 ? 4 : 2; }

#if MEMWALL_ADAM_X86
// F16C from CPUID leaf 1 (ECX bit 29): clang's __builtin_cpu_supports does not know "f16c".
bool has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0;
}
#endif

bool isa_supported(Isa isa) {
  switch (isa) {
    case Isa::scalar: return true;
#if MEMWALL_ADAM_X86
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c();
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && has_f16c();
#else
    default: return false;
#endif
  }
  return false;
}

Isa best_isa() {
  if (isa_supported(Isa::avx512)) return Isa::avx512;
  if (isa_supported(Isa::avx2)) return Isa::avx2;
  return Isa::scalar;
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512})
    if (isa_supported(i)) out.push_back(i);
  return out;
}

struct CpuAdam::Impl {
  AdamOptions options;
  detail::KernelTable kernels;
  WorkerPool pool;
  std::atomic<int> in_use;  // set_threads_in_use's cap, <= pool.size()
  Impl(const AdamOptions& o, detail::KernelTable k, int threads)
      : options(o), kernels(k), pool(threads), in_use(threads) {}
  int used_for(std::size_t n) const { return threads_for(n, in_use.load(std::memory_order_relaxed)); }
};

CpuAdam::CpuAdam(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CpuAdam::CpuAdam(CpuAdam&&) noexcept = default;
CpuAdam& CpuAdam::operator=(CpuAdam&&) noexcept = default;
CpuAdam::~CpuAdam() = default;

const AdamOptions& CpuAdam::options() const { return impl_->options; }
Isa CpuAdam::isa() const { return impl_->kernels.isa; }
int CpuAdam::threads() const { return impl_->pool.size(); }
int CpuAdam::threads_in_use() const { return impl_->in_use.load(std::memory_order_relaxed); }
void CpuAdam::set_threads_in_use(int n) {
  impl_->in_use.store(std::clamp(n, 1, impl_->pool.size()), std::memory_order_relaxed);
}

Result<CpuAdam> CpuAdam::create(const AdamOptions& options, int threads, std::optional<Isa> isa) {
  Result<int> n_threads = check_options(options, threads);
  if (!n_threads) return make_error(n_threads.error());
  const Isa want = isa.value_or(best_isa());
  if (!isa_supported(want))
    return make_error("adam: isa: this CPU (or this build) cannot run " + std::string(isa_name(want)));
  try {
    return CpuAdam(std::make_unique<Impl>(options, *kernels_for(want), *n_threads));
  } catch (const std::system_error& e) {
    return make_error("threads: cannot start " + std::to_string(*n_threads) + " threads: " + e.code().message());
  }
}

Result<std::size_t> CpuAdam::step(const AdamChunk& c, long step, const GradScaling& scaling, std::optional<double> lr) {
  if (lr && !(*lr >= 0 && std::isfinite(*lr))) return make_error("adam: lr: expected a finite value >= 0, got " + fmt(*lr));
  if (step < 1) return make_error("adam: step: expected the step number after incrementing (>= 1), got " + fmt(step));
  if (!(scaling.loss_scale > 0 && std::isfinite(scaling.loss_scale)))
    return make_error("adam: loss_scale: expected a finite value > 0, got " + fmt(scaling.loss_scale));
  if (!(scaling.clip_coef >= 0 && std::isfinite(scaling.clip_coef)))
    return make_error("adam: clip_coef: expected a finite value >= 0, got " + fmt(scaling.clip_coef));
  if (c.n == 0) return std::size_t{0};
  if (!c.param || !c.exp_avg || !c.exp_avg_sq || !c.grad)
    return make_error("adam: chunk: param, exp_avg, exp_avg_sq and grad must all be given for " +
                      std::to_string(c.n) + " elements");
  if (c.param16 && c.param16_dtype == DType::fp32)
    return make_error("adam: chunk: param16_dtype: expected fp16 or bf16, got fp32");

  AdamOptions options = impl_->options;
  if (lr) options.lr = *lr;
  const StepScalars s = step_scalars(options, step, scaling);
  const detail::AdamKernel kernel = impl_->kernels.adam;
  const int used = impl_->used_for(c.n);
  impl_->pool.run(used, [&](int t) {
    const auto [b, e] = thread_range(c.n, used, t);
    if (b >= e) return;
    const std::size_t gb = dtype_bytes(c.grad_dtype);
    detail::KernelArgs a{c.param + b,
                         static_cast<const char*>(c.grad) + b * gb,
                         c.exp_avg + b,
                         c.exp_avg_sq + b,
                         c.param16 ? static_cast<char*>(c.param16) + b * 2 : nullptr,
                         e - b,
                         c.grad_dtype,
                         c.param16_dtype,
                         s};
    kernel(a);
  });
  return c.n;
}

Result<std::size_t> CpuAdam::convert(const float* src, void* dst, DType dst_dtype, std::size_t n) {
  if (dst_dtype == DType::fp32) return make_error("adam: convert: expected fp16 or bf16, got fp32");
  if (n == 0) return std::size_t{0};
  if (!src || !dst) return make_error("adam: convert: src and dst must be given");
  const detail::ConvertKernel kernel = impl_->kernels.convert;
  const int used = impl_->used_for(n);
  impl_->pool.run(used, [&](int t) {
    const auto [b, e] = thread_range(n, used, t);
    if (b < e) kernel(src + b, static_cast<char*>(dst) + b * 2, dst_dtype, e - b);
  });
  return n;
}

}  // namespace memwall::adam
