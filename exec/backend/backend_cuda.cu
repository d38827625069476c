// The cuda backend: cudaMalloc against a hard capacity, a compute stream plus copy streams,
// events, cuBLAS GEMMs (fp32, or fp16 / bf16 tensor-core compute with fp32 accumulation) and small
// hand-written fp32 kernels for the rest. Activations stay fp32 in device memory: the 16-bit
// formats are used where the FLOPs are, inside cuBLAS (CUBLAS_COMPUTE_32F_FAST_16F / _16BF), and
// for 16-bit parameter / gradient buffers through the conversion kernels (exec/backend/half.hpp,
// the cpu backend's rounding bit for bit). adam_update is torch's Adam in IEEE-rounded intrinsics.
// The kernels are written for clarity, one thread (or warp) per output row or element (llm.c's
// first CUDA versions, not its fused ones); atomics make some backward sums order-dependent, so
// unlike the cpu backend results may differ in the last bits run to run (the attention kernels
// use no atomics).
// Every CUDA and cuBLAS call goes through CUDA_CHECK / CUBLAS_CHECK: a failure is recorded with
// file:line as the backend's sticky error (the first one wins) and printed to stderr.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "exec/adam/cpu_adam.hpp"
#include "exec/backend/backend.hpp"
#include "exec/backend/half.hpp"
#include "model/units.hpp"

namespace memwall::exec {
namespace {

struct CudaCtx {
  std::size_t capacity_bytes = 0;
  std::size_t used = 0;
  std::unordered_map<void*, std::size_t> sizes;
  std::vector<cudaStream_t> streams;  // streams[0] is the compute stream
  cublasHandle_t blas = nullptr;
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  std::string error;
  // attention_scores_backward's row sums (B*NH*T floats), grown on demand; the backend's own,
  // outside alloc()'s capacity
  float* scratch = nullptr;
  std::size_t scratch_bytes = 0;
};

CudaCtx& X(void* ctx) { return *static_cast<CudaCtx*>(ctx); }

void record_error(CudaCtx& c, const std::string& what, const char* file, int line) {
  const std::string msg = std::string(file) + ":" + std::to_string(line) + ": " + what;
  std::fprintf(stderr, "memwall cuda backend: %s\n", msg.c_str());
  if (c.error.empty()) c.error = msg;
}

#define CUDA_CHECK(c, call)                                                        \
  do {                                                                             \
    cudaError_t err_ = (call);                                                     \
    if (err_ != cudaSuccess) record_error(c, cudaGetErrorString(err_), __FILE__, __LINE__); \
  } while (0)
#define CUBLAS_CHECK(c, call)                                                                       \
  do {                                                                                              \
    cublasStatus_t st_ = (call);                                                                    \
    if (st_ != CUBLAS_STATUS_SUCCESS) record_error(c, std::string("cuBLAS ") + cublasGetStatusString(st_), __FILE__, __LINE__); \
  } while (0)
#define LAUNCH_CHECK(c) CUDA_CHECK(c, cudaGetLastError())

cudaStream_t S(void* ctx, Stream s) { return X(ctx).streams.at(std::size_t(s)); }
cudaStream_t K(void* ctx) { return X(ctx).streams[0]; }
int blocks(long n, int threads) { return int((n + threads - 1) / threads); }

// ---- memory, streams, events ----

Result<void*> cu_alloc(void* ctx, std::size_t bytes) {
  CudaCtx& c = X(ctx);
  if (c.used + bytes > c.capacity_bytes)
    return make_error("out of memory on the cuda device: " + format_bytes(double(bytes)) + " requested, " +
                      format_bytes(double(c.used)) + " of " + format_bytes(double(c.capacity_bytes)) + " in use");
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  if (e != cudaSuccess)
    return make_error("out of memory on the cuda device: cudaMalloc(" + format_bytes(double(bytes)) +
                      "): " + cudaGetErrorString(e));
  c.sizes[p] = bytes;
  c.used += bytes;
  return p;
}

void cu_free(void* ctx, void* p) {
  CudaCtx& c = X(ctx);
  auto it = c.sizes.find(p);
  if (it == c.sizes.end()) return;
  CUDA_CHECK(c, cudaFree(p));
  c.used -= it->second;
  c.sizes.erase(it);
}

std::size_t cu_used(void* ctx) { return X(ctx).used; }
void cu_memset(void* ctx, void* p, std::size_t bytes) { CUDA_CHECK(X(ctx), cudaMemsetAsync(p, 0, bytes, K(ctx))); }

Result<Stream> cu_stream_create(void* ctx) {
  cudaStream_t s;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess) return make_error(std::string("cudaStreamCreate: ") + cudaGetErrorString(e));
  X(ctx).streams.push_back(s);
  return Stream(X(ctx).streams.size() - 1);
}
void cu_copy(void* ctx, Stream s, void* dst, const void* src, std::size_t bytes) {
  CUDA_CHECK(X(ctx), cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, S(ctx, s)));
}
Event cu_event_create(void* ctx) {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(X(ctx), cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}
void cu_event_destroy(void* ctx, Event e) { CUDA_CHECK(X(ctx), cudaEventDestroy(cudaEvent_t(e))); }
void cu_event_record(void* ctx, Event e, Stream s) { CUDA_CHECK(X(ctx), cudaEventRecord(cudaEvent_t(e), S(ctx, s))); }
void cu_event_sync(void* ctx, Event e) { CUDA_CHECK(X(ctx), cudaEventSynchronize(cudaEvent_t(e))); }
bool cu_event_query(void* ctx, Event e) {
  const cudaError_t err = cudaEventQuery(cudaEvent_t(e));
  if (err == cudaSuccess) return true;
  if (err == cudaErrorNotReady) {
    // not an error, but the runtime may keep it as the last error: clear it so the next
    // LAUNCH_CHECK does not report it (what PyTorch's CUDAEvent::query does)
    const cudaError_t last = cudaGetLastError();
    if (last != cudaSuccess && last != cudaErrorNotReady)
      record_error(X(ctx), cudaGetErrorString(last), __FILE__, __LINE__);
    return false;
  }
  record_error(X(ctx), cudaGetErrorString(err), __FILE__, __LINE__);
  return true;  // sticky now: a caller polling for completion stops and finds sticky_error
}
void cu_wait(void* ctx, Stream s, Event e) { CUDA_CHECK(X(ctx), cudaStreamWaitEvent(S(ctx, s), cudaEvent_t(e), 0)); }
void cu_sync(void* ctx) {
  for (cudaStream_t s : X(ctx).streams) CUDA_CHECK(X(ctx), cudaStreamSynchronize(s));
}
Result<bool> cu_host_register(void*, void* p, std::size_t bytes) {
  cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
  if (e != cudaSuccess) return make_error(std::string("cudaHostRegister: ") + cudaGetErrorString(e));
  return true;
}
void cu_host_unregister(void* ctx, void* p) { CUDA_CHECK(X(ctx), cudaHostUnregister(p)); }

// ---- GEMM ----

void cu_gemm(void* ctx, bool ta, bool tb, int M, int N, int K_, float alpha, const float* A, int lda, long sa,
             const float* B, int ldb, long sb, float beta, float* C, int ldc, long sc, int batch) {
  // row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands
  CudaCtx& c = X(ctx);
  CUBLAS_CHECK(c, cublasGemmStridedBatchedEx(c.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                             N, M, K_, &alpha, B, CUDA_R_32F, ldb, sb, A, CUDA_R_32F, lda, sa, &beta,
                                             C, CUDA_R_32F, ldc, sc, batch, c.compute, CUBLAS_GEMM_DEFAULT));
}

// ---- kernels (shapes as in backend.hpp) ----

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__global__ void encoder_fwd_k(float* out, const int* tok, const float* wte, const float* wpe, int BT, int T, int C) {
  long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= long(BT) * C) return;
  int bt = int(i / C), c = int(i % C);
  out[i] = wte[long(tok[bt]) * C + c] + wpe[long(bt % T) * C + c];
}
__global__ void encoder_bwd_k(float* dwte, float* dwpe, const float* dout, const int* tok, int BT, int T, int C) {
  long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= long(BT) * C) return;
  int bt = int(i / C), c = int(i % C);
  atomicAdd(dwte + long(tok[bt]) * C + c, dout[i]);
  atomicAdd(dwpe + long(bt % T) * C + c, dout[i]);
}

// one warp per row
__global__ void layernorm_fwd_k(float* out, float* mean, float* rstd, const float* inp, const float* w,
                                const float* b, int BT, int C) {
  int r = blockIdx.x, lane = threadIdx.x;
  if (r >= BT) return;
  const float* x = inp + long(r) * C;
  float s = 0;
  for (int i = lane; i < C; i += 32) s += x[i];
  const float m = warp_sum(s) / C;
  float v = 0;
  for (int i = lane; i < C; i += 32) v += (x[i] - m) * (x[i] - m);
  const float rs = rsqrtf(warp_sum(v) / C + 1e-5f);
  for (int i = lane; i < C; i += 32) out[long(r) * C + i] = (rs * (x[i] - m)) * w[i] + b[i];
  if (lane == 0) mean[r] = m, rstd[r] = rs;
}
__global__ void layernorm_bwd_k(float* dinp, float* dw, float* db, const float* dout, const float* inp,
                                const float* w, const float* mean, const float* rstd, int BT, int C) {
  int r = blockIdx.x, lane = threadIdx.x;
  if (r >= BT) return;
  const float* x = inp + long(r) * C;
  const float* d = dout + long(r) * C;
  float a = 0, bsum = 0;
  for (int i = lane; i < C; i += 32) {
    const float n = (x[i] - mean[r]) * rstd[r];
    a += w[i] * d[i];
    bsum += w[i] * d[i] * n;
  }
  const float dn_mean = warp_sum(a) / C, dn_norm_mean = warp_sum(bsum) / C;
  for (int i = lane; i < C; i += 32) {
    const float n = (x[i] - mean[r]) * rstd[r];
    dinp[long(r) * C + i] += (w[i] * d[i] - dn_mean - n * dn_norm_mean) * rstd[r];
    atomicAdd(dw + i, d[i] * n);
    atomicAdd(db + i, d[i]);
  }
}

// out[r * ldo + o] += bias[o]: OC columns of a (BT, ldo) output
__global__ void bias_fwd_k(float* out, const float* bias, int BT, int OC, int ldo) {
  long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= long(BT) * OC) return;
  const long r = i / OC;
  const int o = int(i % OC);
  out[r * ldo + o] += bias[o];
}
// forward: out[r * ldo + o] += bias[o]; one thread per column, rows in order
__global__ void bias_bwd_k(float* dbias, const float* dout, int BT, int OC, int ldd) {
  int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  float s = 0;
  for (int r = 0; r < BT; ++r) s += dout[long(r) * ldd + o];
  dbias[o] += s;
}

// Attention: q, k, v = qkv[b, t, 0:C], [C:2C], [2C:3C], head h at channels h*hs .. (h+1)*hs;
// att rows are (b, h, t), row r = (b * NH + h) * T + t. No atomics: every output element is
// written by one thread, which sums in a fixed order.

// one warp per (b, h, t) row; lane l takes t2 = l, l + 32, ... (and only ever touches those)
__global__ void attention_scores_fwd_k(float* att, const float* qkv, int B, int T, int C, int NH) {
  const long row = blockIdx.x;
  const int lane = threadIdx.x;
  if (row >= long(B) * NH * T) return;
  const int t = int(row % T), h = int(row / T % NH), b = int(row / (long(T) * NH)), hs = C / NH;
  const float scale = 1.0f / sqrtf(float(hs));
  const float* q = qkv + (long(b) * T + t) * 3 * C + h * hs;
  float* a = att + row * T;
  float maxv = -INFINITY;
  for (int t2 = lane; t2 <= t; t2 += 32) {
    const float* k = qkv + (long(b) * T + t2) * 3 * C + C + h * hs;
    float s = 0;
    for (int j = 0; j < hs; ++j) s += q[j] * k[j];
    a[t2] = s * scale;
    maxv = fmaxf(maxv, a[t2]);
  }
  maxv = warp_max(maxv);
  float sum = 0;
  for (int t2 = lane; t2 <= t; t2 += 32) {
    a[t2] = expf(a[t2] - maxv);
    sum += a[t2];
  }
  const float inv = 1.0f / warp_sum(sum);
  for (int t2 = lane; t2 < T; t2 += 32) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
}

// out[b,t,c] = sum over t2 <= t of att[b,h,t,t2] * v[b,t2,c], h = c / hs; one thread per element
__global__ void attention_context_fwd_k(float* out, const float* att, const float* qkv, int B, int T, int C, int NH) {
  const long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= long(B) * T * C) return;
  const int c = int(i % C), t = int(i / C % T), b = int(i / (long(C) * T)), h = c / (C / NH);
  const float* a = att + ((long(b) * NH + h) * T + t) * T;
  float s = 0;
  for (int t2 = 0; t2 <= t; ++t2) s += a[t2] * qkv[(long(b) * T + t2) * 3 * C + 2 * C + c];
  out[i] = s;
}

// forward: out[b,t,h] = sum_t2 att[b,h,t,t2] * v[b,t2,h]
// datt[b,h,t,t2] += dout[b,t,h] . v[b,t2,h] for t2 <= t; one thread per (b, h, t, t2)
__global__ void attention_datt_k(float* datt, const float* dout, const float* qkv, int B, int T, int C, int NH) {
  const long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= long(B) * NH * T * T) return;
  const int t2 = int(i % T), t = int(i / T % T);
  if (t2 > t) return;
  const long bh = i / (long(T) * T);
  const int b = int(bh / NH), h = int(bh % NH), hs = C / NH;
  const float* d = dout + (long(b) * T + t) * C + h * hs;
  const float* v = qkv + (long(b) * T + t2) * 3 * C + 2 * C + h * hs;
  float s = 0;
  for (int j = 0; j < hs; ++j) s += v[j] * d[j];
  datt[i] += s;
}
// dv[b,t2,c] += sum over t >= t2 of att[b,h,t,t2] * dout[b,t,c]; one thread per (b, t2, c)
__global__ void attention_dv_k(float* dqkv, const float* dout, const float* att, int B, int T, int C, int NH) {
  const long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= long(B) * T * C) return;
  const int c = int(i % C), t2 = int(i / C % T), b = int(i / (long(C) * T)), h = c / (C / NH);
  const float* a = att + (long(b) * NH + h) * T * T + t2;  // column t2 of the head's (T, T)
  float s = 0;
  for (int t = t2; t < T; ++t) s += a[long(t) * T] * dout[(long(b) * T + t) * C + c];
  dqkv[(long(b) * T + t2) * 3 * C + 2 * C + c] += s;
}

// forward: att = softmax(pre); dot[row] = sum over t2 <= t of att[row, t2] * datt[row, t2]; one warp per row
__global__ void attention_softmax_dot_k(float* dot, const float* att, const float* datt, long rows, int T) {
  const long row = blockIdx.x;
  const int lane = threadIdx.x;
  if (row >= rows) return;
  const int t = int(row % T);
  float s = 0;
  for (int t2 = lane; t2 <= t; t2 += 32) s += att[row * T + t2] * datt[row * T + t2];
  s = warp_sum(s);
  if (lane == 0) dot[row] = s;
}
// forward: pre[t,t2] = scale * q[t] . k[t2]; with g[t,t2] = scale * att * (datt - dot[t]) (dpre * scale):
// dq[b,t,c] += sum over t2 <= t of g[t,t2] * k[b,t2,c]    (threads c < C of a position)
// dk[b,t2,c] += sum over t >= t2 of g[t,t2] * q[b,t,c]    (threads C <= c < 2C)
__global__ void attention_dqk_k(float* dqkv, const float* dot, const float* datt, const float* att, const float* qkv,
                                int B, int T, int C, int NH) {
  const long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= long(B) * T * 2 * C) return;
  const int c2 = int(i % (2 * C)), t = int(i / (2 * C) % T), b = int(i / (2L * C * T));
  const int c = c2 % C, h = c / (C / NH);
  const float scale = 1.0f / sqrtf(float(C / NH));
  const long head = (long(b) * NH + h) * T;  // row of (b, h, 0)
  float s = 0;
  if (c2 < C) {
    const long r = head + t;
    for (int t2 = 0; t2 <= t; ++t2) {
      const float g = att[r * T + t2] * (datt[r * T + t2] - dot[r]) * scale;
      s += g * qkv[(long(b) * T + t2) * 3 * C + C + c];
    }
  } else {
    for (int tq = t; tq < T; ++tq) {  // t is the key position here
      const long r = head + tq;
      const float g = att[r * T + t] * (datt[r * T + t] - dot[r]) * scale;
      s += g * qkv[(long(b) * T + tq) * 3 * C + c];
    }
  }
  dqkv[(long(b) * T + t) * 3 * C + c2] += s;
}

constexpr float kGeluS = 0.7978845608028654f;
__global__ void gelu_fwd_k(float* out, const float* inp, long N) {
  long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N) return;
  const float x = inp[i];
  out[i] = 0.5f * x * (1.0f + tanhf(kGeluS * (x + 0.044715f * x * x * x)));
}
__global__ void gelu_bwd_k(float* dinp, const float* inp, const float* dout, long N) {
  long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= N) return;
  const float x = inp[i];
  const float th = tanhf(kGeluS * (x + 0.044715f * x * x * x));
  const float g = 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluS * (1.0f + 3.0f * 0.044715f * x * x);
  dinp[i] += g * dout[i];
}
__global__ void residual_k(float* out, const float* a, const float* b, long N) {
  long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < N) out[i] = a[i] + b[i];
}
__global__ void accumulate_k(float* dst, const float* src, long N) {
  long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < N) dst[i] += src[i];
}
// one warp per row
__global__ void crossentropy_fwd_k(float* probs, float* losses, const float* logits, const int* targets, int BT,
                                   int V) {
  int r = blockIdx.x, lane = threadIdx.x;
  if (r >= BT) return;
  const float* l = logits + long(r) * V;
  float m = -INFINITY;
  for (int i = lane; i < V; i += 32) m = fmaxf(m, l[i]);
  m = warp_max(m);
  float s = 0;
  for (int i = lane; i < V; i += 32) s += expf(l[i] - m);
  s = warp_sum(s);
  for (int i = lane; i < V; i += 32) probs[long(r) * V + i] = expf(l[i] - m) / s;
  if (lane == 0) losses[r] = -(l[targets[r]] - m - logf(s));
}
__global__ void crossentropy_bwd_k(float* dlogits, const float* probs, const int* targets, float dloss, int BT, int V) {
  long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= long(BT) * V) return;
  const int r = int(i / V), v = int(i % V);
  dlogits[i] += (probs[i] - (v == targets[r] ? 1.0f : 0.0f)) * dloss;
}

// 16-bit conversions, one thread per element (half.hpp: the cpu backend's rounding)
__global__ void to_fp32_k(float* dst, const std::uint16_t* src, adam::DType t, long n) {
  const long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = half::f32_from_half(src[i], t);
}
__global__ void from_fp32_k(std::uint16_t* dst, const float* src, adam::DType t, long n) {
  const long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = half::half_from_f32(src[i], t);
}
__global__ void accumulate_to_k(std::uint16_t* dst, const float* src, adam::DType t, long n) {
  const long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = half::half_from_f32(half::add_f32(half::f32_from_half(dst[i], t), src[i]), t);
}

// One element per thread, CpuAdam's adam_element operation for operation, each rounding spelled
// with an IEEE round-to-nearest intrinsic so nvcc cannot contract or approximate it: add(alpha)
// is one fma, addcmul is fma(value * t1, t2, self), addcdiv is self + (value * t1) / t2.
__global__ void adam_k(float* param, float* exp_avg, float* exp_avg_sq, const void* grad, adam::DType grad_type,
                       std::uint16_t* param16, adam::DType param16_type, std::size_t n, adam::StepScalars s) {
  const std::size_t i = std::size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const auto* grad16 = static_cast<const std::uint16_t*>(grad);
  float g = grad_type == adam::DType::fp32 ? static_cast<const float*>(grad)[i]
                                           : half::f32_from_half(grad16[i], grad_type);
  float p = param[i], m = exp_avg[i], v = exp_avg_sq[i];
  if (s.use_l2) g = __fmaf_rn(p, s.l2, g);                                   // grad.add(param, alpha=wd)
  if (s.decoupled) p = __fmul_rn(p, s.param_decay);                          // param.mul_(1 - lr * wd)
  m = __fmaf_rn(g, s.one_minus_beta1, __fmul_rn(m, s.beta1));                // exp_avg.mul_(b1).add_(g, alpha=1-b1)
  v = __fmaf_rn(__fmul_rn(s.one_minus_beta2, g), g, __fmul_rn(v, s.beta2));  // exp_avg_sq.mul_(b2).addcmul_(g, g, 1-b2)
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), s.bias_correction2_sqrt), s.eps);
  p = __fadd_rn(p, __fdiv_rn(__fmul_rn(s.neg_step_size, m), denom));        // param.addcdiv_(m, denom, -step_size)
  param[i] = p;
  exp_avg[i] = m;
  exp_avg_sq[i] = v;
  if (param16) param16[i] = half::half_from_f32(p, param16_type);
}

constexpr int kThreads = 256;

void cu_encoder_fwd(void* ctx, float* out, const int* tok, const float* wte, const float* wpe, int B, int T, int C) {
  encoder_fwd_k<<<blocks(long(B) * T * C, kThreads), kThreads, 0, K(ctx)>>>(out, tok, wte, wpe, B * T, T, C);
  LAUNCH_CHECK(X(ctx));
}
void cu_encoder_bwd(void* ctx, float* dwte, float* dwpe, const float* dout, const int* tok, int B, int T, int C) {
  encoder_bwd_k<<<blocks(long(B) * T * C, kThreads), kThreads, 0, K(ctx)>>>(dwte, dwpe, dout, tok, B * T, T, C);
  LAUNCH_CHECK(X(ctx));
}
void cu_ln_fwd(void* ctx, float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
               int BT, int C) {
  layernorm_fwd_k<<<BT, 32, 0, K(ctx)>>>(out, mean, rstd, inp, w, b, BT, C);
  LAUNCH_CHECK(X(ctx));
}
void cu_ln_bwd(void* ctx, float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
               const float* mean, const float* rstd, int BT, int C) {
  layernorm_bwd_k<<<BT, 32, 0, K(ctx)>>>(dinp, dw, db, dout, inp, w, mean, rstd, BT, C);
  LAUNCH_CHECK(X(ctx));
}
void cu_bias_fwd(void* ctx, float* out, const float* bias, int BT, int OC, int ldo) {
  if (long(BT) * OC == 0) return;
  bias_fwd_k<<<blocks(long(BT) * OC, kThreads), kThreads, 0, K(ctx)>>>(out, bias, BT, OC, ldo);
  LAUNCH_CHECK(X(ctx));
}
void cu_bias_bwd(void* ctx, float* dbias, const float* dout, int BT, int OC, int ldd) {
  if (OC == 0) return;
  bias_bwd_k<<<blocks(OC, kThreads), kThreads, 0, K(ctx)>>>(dbias, dout, BT, OC, ldd);
  LAUNCH_CHECK(X(ctx));
}
void cu_att_scores_fwd(void* ctx, float* att, const float* qkv, int B, int T, int C, int NH) {
  const long rows = long(B) * NH * T;
  if (rows == 0) return;
  attention_scores_fwd_k<<<unsigned(rows), 32, 0, K(ctx)>>>(att, qkv, B, T, C, NH);
  LAUNCH_CHECK(X(ctx));
}
void cu_att_context_fwd(void* ctx, float* out, const float* att, const float* qkv, int B, int T, int C, int NH) {
  const long n = long(B) * T * C;
  if (n == 0) return;
  attention_context_fwd_k<<<blocks(n, kThreads), kThreads, 0, K(ctx)>>>(out, att, qkv, B, T, C, NH);
  LAUNCH_CHECK(X(ctx));
}
void cu_att_context_bwd(void* ctx, float* datt, float* dqkv, const float* dout, const float* att, const float* qkv,
                        int B, int T, int C, int NH) {
  const long n_att = long(B) * NH * T * T, n_v = long(B) * T * C;
  if (n_att == 0 || n_v == 0) return;
  attention_datt_k<<<blocks(n_att, kThreads), kThreads, 0, K(ctx)>>>(datt, dout, qkv, B, T, C, NH);
  LAUNCH_CHECK(X(ctx));
  attention_dv_k<<<blocks(n_v, kThreads), kThreads, 0, K(ctx)>>>(dqkv, dout, att, B, T, C, NH);
  LAUNCH_CHECK(X(ctx));
}
void cu_att_scores_bwd(void* ctx, float* dqkv, const float* datt, const float* att, const float* qkv, int B, int T,
                       int C, int NH) {
  CudaCtx& c = X(ctx);
  const long rows = long(B) * NH * T;
  if (rows == 0 || C == 0) return;
  const std::size_t bytes = std::size_t(rows) * sizeof(float);
  if (bytes > c.scratch_bytes) {  // grow: the old buffer may still be read by queued kernels
    if (c.scratch) {
      CUDA_CHECK(c, cudaStreamSynchronize(K(ctx)));
      CUDA_CHECK(c, cudaFree(c.scratch));
      c.scratch = nullptr;
      c.scratch_bytes = 0;
    }
    cudaError_t e = cudaMalloc(&c.scratch, bytes);
    if (e != cudaSuccess) {
      c.scratch = nullptr;
      record_error(c, std::string("attention_scores_backward scratch: ") + cudaGetErrorString(e), __FILE__, __LINE__);
      return;
    }
    c.scratch_bytes = bytes;
  }
  attention_softmax_dot_k<<<unsigned(rows), 32, 0, K(ctx)>>>(c.scratch, att, datt, rows, T);
  LAUNCH_CHECK(c);
  const long n = long(B) * T * 2 * C;
  attention_dqk_k<<<blocks(n, kThreads), kThreads, 0, K(ctx)>>>(dqkv, c.scratch, datt, att, qkv, B, T, C, NH);
  LAUNCH_CHECK(c);
}
void cu_gelu_fwd(void* ctx, float* out, const float* inp, long N) {
  gelu_fwd_k<<<blocks(N, kThreads), kThreads, 0, K(ctx)>>>(out, inp, N);
  LAUNCH_CHECK(X(ctx));
}
void cu_gelu_bwd(void* ctx, float* dinp, const float* inp, const float* dout, long N) {
  gelu_bwd_k<<<blocks(N, kThreads), kThreads, 0, K(ctx)>>>(dinp, inp, dout, N);
  LAUNCH_CHECK(X(ctx));
}
void cu_residual(void* ctx, float* out, const float* a, const float* b, long N) {
  residual_k<<<blocks(N, kThreads), kThreads, 0, K(ctx)>>>(out, a, b, N);
  LAUNCH_CHECK(X(ctx));
}
void cu_accumulate(void* ctx, float* dst, const float* src, long N) {
  accumulate_k<<<blocks(N, kThreads), kThreads, 0, K(ctx)>>>(dst, src, N);
  LAUNCH_CHECK(X(ctx));
}
void cu_ce_fwd(void* ctx, float* probs, float* losses, const float* logits, const int* targets, int BT, int V) {
  crossentropy_fwd_k<<<BT, 32, 0, K(ctx)>>>(probs, losses, logits, targets, BT, V);
  LAUNCH_CHECK(X(ctx));
}
void cu_ce_bwd(void* ctx, float* dlogits, const float* probs, const int* targets, float dloss, int BT, int V) {
  crossentropy_bwd_k<<<blocks(long(BT) * V, kThreads), kThreads, 0, K(ctx)>>>(dlogits, probs, targets, dloss, BT, V);
  LAUNCH_CHECK(X(ctx));
}

void cu_copy_fp32(void* ctx, void* dst, const void* src, long n) {
  CUDA_CHECK(X(ctx), cudaMemcpyAsync(dst, src, std::size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, K(ctx)));
}
void cu_to_fp32(void* ctx, float* dst, const void* src, adam::DType t, long n) {
  if (n <= 0) return;
  if (t == adam::DType::fp32) return cu_copy_fp32(ctx, dst, src, n);
  to_fp32_k<<<blocks(n, kThreads), kThreads, 0, K(ctx)>>>(dst, static_cast<const std::uint16_t*>(src), t, n);
  LAUNCH_CHECK(X(ctx));
}
void cu_from_fp32(void* ctx, void* dst, const float* src, adam::DType t, long n) {
  if (n <= 0) return;
  if (t == adam::DType::fp32) return cu_copy_fp32(ctx, dst, src, n);
  from_fp32_k<<<blocks(n, kThreads), kThreads, 0, K(ctx)>>>(static_cast<std::uint16_t*>(dst), src, t, n);
  LAUNCH_CHECK(X(ctx));
}
void cu_accumulate_to(void* ctx, void* dst, const float* src, adam::DType t, long n) {
  if (n <= 0) return;
  if (t == adam::DType::fp32) return cu_accumulate(ctx, static_cast<float*>(dst), src, n);
  accumulate_to_k<<<blocks(n, kThreads), kThreads, 0, K(ctx)>>>(static_cast<std::uint16_t*>(dst), src, t, n);
  LAUNCH_CHECK(X(ctx));
}

// The step's scalars in double (Python's float arithmetic), then cast where ATen casts them:
// the same expressions as CpuAdam's (exec/adam/cpu_adam.cpp, step_scalars).
void cu_adam_update(void* ctx, const DeviceAdam& d) {
  CudaCtx& c = X(ctx);
  if (d.step < 1)
    return record_error(c, "adam_update: step: expected the step number after incrementing (>= 1), got " +
                               std::to_string(d.step), __FILE__, __LINE__);
  if (d.param16 && d.param16_type == adam::DType::fp32)
    return record_error(c, "adam_update: param16_type: expected fp16 or bf16, got fp32", __FILE__, __LINE__);
  if (d.n == 0) return;
  if (!d.param || !d.exp_avg || !d.exp_avg_sq || !d.grad)
    return record_error(c, "adam_update: param, exp_avg, exp_avg_sq and grad must all be given", __FILE__, __LINE__);
  adam::AdamOptions ao;
  ao.lr = d.lr;
  ao.beta1 = d.beta1;
  ao.beta2 = d.beta2;
  ao.eps = d.eps;
  ao.weight_decay = d.weight_decay;
  ao.decoupled_weight_decay = d.decoupled_weight_decay;
  const adam::StepScalars s = adam::step_scalars(ao, d.step);  // CpuAdam's constants, rounded alike
  adam_k<<<blocks(long(d.n), kThreads), kThreads, 0, K(ctx)>>>(d.param, d.exp_avg, d.exp_avg_sq, d.grad, d.grad_type,
                                                               static_cast<std::uint16_t*>(d.param16), d.param16_type,
                                                               d.n, s);
  LAUNCH_CHECK(c);
}

const char* cu_sticky_error(void* ctx) { return X(ctx).error.empty() ? nullptr : X(ctx).error.c_str(); }

void cu_destroy(void* ctx) {
  CudaCtx* c = static_cast<CudaCtx*>(ctx);
  cu_sync(ctx);
  for (auto& [p, n] : c->sizes) cudaFree(p);
  if (c->scratch) cudaFree(c->scratch);
  if (c->blas) cublasDestroy(c->blas);
  for (cudaStream_t s : c->streams) cudaStreamDestroy(s);
  delete c;
}

void* cu_native_stream(void* ctx, Stream s) { return S(ctx, s); }

const BackendOps kCudaOps = {
    cu_alloc,
    cu_free,
    cu_used,
    cu_memset,
    cu_stream_create,
    cu_copy,
    cu_copy,
    cu_copy,
    cu_event_create,
    cu_event_destroy,
    cu_event_record,
    cu_event_sync,
    cu_event_query,
    cu_wait,
    cu_sync,
    cu_host_register,
    cu_host_unregister,
    cu_gemm,
    cu_encoder_fwd,
    cu_encoder_bwd,
    cu_ln_fwd,
    cu_ln_bwd,
    cu_bias_fwd,
    cu_bias_bwd,
    cu_att_scores_fwd,
    cu_att_context_fwd,
    cu_att_context_bwd,
    cu_att_scores_bwd,
    cu_gelu_fwd,
    cu_gelu_bwd,
    cu_residual,
    cu_accumulate,
    cu_ce_fwd,
    cu_ce_bwd,
    cu_to_fp32,
    cu_from_fp32,
    cu_accumulate_to,
    cu_adam_update,
    cu_sticky_error,
    cu_native_stream,
    nullptr,  // set_host_threads: the host runs no kernels
    cu_destroy,
};

}  // namespace

Result<std::unique_ptr<Backend>> create_cuda_backend(const BackendOptions& o) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0)
    return make_error(std::string("no CUDA device: ") +
                      (e != cudaSuccess ? cudaGetErrorString(e) : "cudaGetDeviceCount found none"));
  auto* c = new CudaCtx;
  auto fail = [c](const std::string& what) {
    delete c;
    return make_error(what);
  };
  if (o.device < 0 || o.device >= count)
    return fail("cuda device " + std::to_string(o.device) + ": this machine has " + std::to_string(count));
  if ((e = cudaSetDevice(o.device)) != cudaSuccess)
    return fail(std::string("cudaSetDevice: ") + cudaGetErrorString(e));
  std::size_t free_b = 0, total_b = 0;
  if ((e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess)
    return fail(std::string("cudaMemGetInfo: ") + cudaGetErrorString(e));
  c->capacity_bytes = o.capacity_bytes ? std::min(o.capacity_bytes, free_b) : free_b;
  cudaStream_t s;
  if ((e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess)
    return fail(std::string("cudaStreamCreate: ") + cudaGetErrorString(e));
  c->streams.push_back(s);
  if (cublasCreate(&c->blas) != CUBLAS_STATUS_SUCCESS) return fail("cublasCreate failed");
  cublasSetStream(c->blas, s);
  c->compute = o.compute == ComputeType::fp16   ? CUBLAS_COMPUTE_32F_FAST_16F
               : o.compute == ComputeType::bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                                : CUBLAS_COMPUTE_32F;
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, o.device);
  BackendCaps caps{"cuda", prop.name, c->capacity_bytes, true, true, true, o.compute};
  return std::make_unique<Backend>(&kCudaOps, c, std::move(caps));
}

}  // namespace memwall::exec
