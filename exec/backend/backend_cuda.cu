// The cuda backend: cudaMalloc against a hard capacity, a compute stream plus copy streams,
// events, cuBLAS GEMMs (fp32, or fp16 / bf16 tensor-core compute with fp32 accumulation) and small
// hand-written fp32 kernels for the rest. Tensors stay fp32 in device memory: the 16-bit formats
// are used where the FLOPs are, inside cuBLAS (CUBLAS_COMPUTE_32F_FAST_16F / _16BF).
// The kernels are written for clarity, one thread per output row or element (llm.c's first CUDA
// versions, not its fused ones); atomics make some backward sums order-dependent, so unlike the
// cpu backend results may differ in the last bits run to run.
// Every CUDA and cuBLAS call goes through CUDA_CHECK / CUBLAS_CHECK: a failure is recorded with
// file:line as the backend's sticky error (the first one wins) and printed to stderr.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "exec/backend/backend.hpp"
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

__global__ void bias_fwd_k(float* out, const float* bias, int BT, int OC) {
  long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < long(BT) * OC) out[i] += bias[i % OC];
}
__global__ void bias_bwd_k(float* dbias, const float* dout, int BT, int OC) {
  int o = blockIdx.x * blockDim.x + threadIdx.x;
  if (o >= OC) return;
  float s = 0;
  for (int r = 0; r < BT; ++r) s += dout[long(r) * OC + o];
  dbias[o] += s;
}

// one thread per (b, h, t) query row
__global__ void attention_fwd_k(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B * NH * T) return;
  const int t = i % T, h = (i / T) % NH, b = i / (T * NH), hs = C / NH;
  const float scale = rsqrtf(float(hs));
  const float* q = qkv + (long(b) * T + t) * 3 * C + h * hs;
  float* a = att + ((long(b) * NH + h) * T + t) * T;
  float maxv = -INFINITY;
  for (int t2 = 0; t2 <= t; ++t2) {
    const float* k = qkv + (long(b) * T + t2) * 3 * C + C + h * hs;
    float s = 0;
    for (int j = 0; j < hs; ++j) s += q[j] * k[j];
    a[t2] = s * scale;
    maxv = fmaxf(maxv, a[t2]);
  }
  float sum = 0;
  for (int t2 = 0; t2 <= t; ++t2) {
    a[t2] = expf(a[t2] - maxv);
    sum += a[t2];
  }
  for (int t2 = 0; t2 < T; ++t2) a[t2] = t2 <= t ? a[t2] / sum : 0.0f;
  float* o = out + (long(b) * T + t) * C + h * hs;
  for (int j = 0; j < hs; ++j) {
    float s = 0;
    for (int t2 = 0; t2 <= t; ++t2) s += a[t2] * qkv[(long(b) * T + t2) * 3 * C + 2 * C + h * hs + j];
    o[j] = s;
  }
}
__global__ void attention_bwd_k(float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T,
                                int C, int NH) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= B * NH * T) return;
  const int t = i % T, h = (i / T) % NH, b = i / (T * NH), hs = C / NH;
  const float scale = rsqrtf(float(hs));
  const float* a = att + ((long(b) * NH + h) * T + t) * T;
  const float* d = dout + (long(b) * T + t) * C + h * hs;
  const float* q = qkv + (long(b) * T + t) * 3 * C + h * hs;
  float* dq = dqkv + (long(b) * T + t) * 3 * C + h * hs;
  // datt[t2] = v[t2] . d, recomputed in both passes instead of kept (no scratch row)
  float dot = 0;
  for (int t2 = 0; t2 <= t; ++t2) {
    const float* v = qkv + (long(b) * T + t2) * 3 * C + 2 * C + h * hs;
    float s = 0;
    for (int j = 0; j < hs; ++j) s += v[j] * d[j];
    dot += a[t2] * s;
  }
  for (int t2 = 0; t2 <= t; ++t2) {
    const long base = (long(b) * T + t2) * 3 * C + h * hs;
    const float* k = qkv + base + C;
    const float* v = qkv + base + 2 * C;
    float s = 0;
    for (int j = 0; j < hs; ++j) s += v[j] * d[j];
    const float g = a[t2] * (s - dot) * scale;
    for (int j = 0; j < hs; ++j) {
      atomicAdd(dqkv + base + 2 * C + j, a[t2] * d[j]);
      atomicAdd(dqkv + base + C + j, g * q[j]);
      dq[j] += g * k[j];
    }
  }
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
void cu_bias_fwd(void* ctx, float* out, const float* bias, int BT, int OC) {
  bias_fwd_k<<<blocks(long(BT) * OC, kThreads), kThreads, 0, K(ctx)>>>(out, bias, BT, OC);
  LAUNCH_CHECK(X(ctx));
}
void cu_bias_bwd(void* ctx, float* dbias, const float* dout, int BT, int OC) {
  bias_bwd_k<<<blocks(OC, kThreads), kThreads, 0, K(ctx)>>>(dbias, dout, BT, OC);
  LAUNCH_CHECK(X(ctx));
}
void cu_att_fwd(void* ctx, float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  attention_fwd_k<<<blocks(long(B) * NH * T, 64), 64, 0, K(ctx)>>>(out, att, qkv, B, T, C, NH);
  LAUNCH_CHECK(X(ctx));
}
void cu_att_bwd(void* ctx, float* dqkv, const float* dout, const float* qkv, const float* att, int B, int T, int C,
                int NH) {
  attention_bwd_k<<<blocks(long(B) * NH * T, 64), 64, 0, K(ctx)>>>(dqkv, dout, qkv, att, B, T, C, NH);
  LAUNCH_CHECK(X(ctx));
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

const char* cu_sticky_error(void* ctx) { return X(ctx).error.empty() ? nullptr : X(ctx).error.c_str(); }

void cu_destroy(void* ctx) {
  CudaCtx* c = static_cast<CudaCtx*>(ctx);
  cu_sync(ctx);
  for (auto& [p, n] : c->sizes) cudaFree(p);
  if (c->blas) cublasDestroy(c->blas);
  for (cudaStream_t s : c->streams) cudaStreamDestroy(s);
  delete c;
}

const BackendOps kCudaOps = {
    cu_alloc,       cu_free,        cu_used,        cu_memset,     cu_stream_create, cu_copy,
    cu_copy,        cu_copy,        cu_event_create, cu_event_destroy, cu_event_record, cu_event_sync,
    cu_wait,        cu_sync,        cu_host_register, cu_host_unregister, cu_gemm,   cu_encoder_fwd,
    cu_encoder_bwd, cu_ln_fwd,      cu_ln_bwd,      cu_bias_fwd,   cu_bias_bwd,      cu_att_fwd,
    cu_att_bwd,     cu_gelu_fwd,    cu_gelu_bwd,    cu_residual,   cu_accumulate,    cu_ce_fwd,
    cu_ce_bwd,      cu_sticky_error, cu_destroy,
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
  if ((e = cudaSetDevice(0)) != cudaSuccess) return fail(std::string("cudaSetDevice: ") + cudaGetErrorString(e));
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
  cudaGetDeviceProperties(&prop, 0);
  BackendCaps caps{"cuda", prop.name, c->capacity_bytes, true, true, true, o.compute};
  return std::make_unique<Backend>(&kCudaOps, c, std::move(caps));
}

}  // namespace memwall::exec
