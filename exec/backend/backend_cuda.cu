// The cuda backend: cudaMalloc against a hard capacity (its own cuBLAS workspace inside it), a
// compute stream plus copy streams, events, cuBLAS GEMMs (fp32, or fp16 / bf16 tensor-core compute
// with fp32 accumulation) and small CUDA kernels for the rest. Activations stay fp32 in device
// memory: the 16-bit formats are used where the FLOPs are, inside cuBLAS (CUBLAS_COMPUTE_32F_FAST_16F
// / _16BF), and for 16-bit parameter / gradient buffers through the conversion kernels
// (exec/backend/half.hpp, the cpu backend's rounding bit for bit). adam_update is torch's Adam in
// IEEE-rounded intrinsics, with CpuAdam's loss scale and clip coefficient.
// Attention's four products are strided-batched GEMMs over the heads of a sequence, beside a
// warp-per-row causal softmax (forward and backward). No kernel uses floating-point atomics:
// column sums (LayerNorm's weight and bias, a linear layer's bias) give a block every row of 32
// columns and add its row groups in a fixed order, the embedding's gradient is summed in position
// order; with cuBLAS's deterministic GEMMs a run gives the same bits every time.
// Every CUDA and cuBLAS call goes through CUDA_CHECK / CUBLAS_CHECK (launches through launch(),
// which also never launches zero work): a failure is recorded with file:line as the backend's
// sticky error (the first one wins) and printed to stderr.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <type_traits>
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
  void* blas_workspace = nullptr;  // cuBLAS's (cublasSetWorkspace), allocated inside the capacity
};

CudaCtx& X(void* ctx) { return *static_cast<CudaCtx*>(ctx); }

// cuBLAS, loaded when the first cuda backend is made (dlopen of the soname this build was compiled
// against) instead of linked: its libraries' start-up (libcublasLt relocates about 150 MB of tables,
// some 70 ms) would otherwise fall on every memwall command, the planner's and the simulator's on
// machines without a GPU too. The six entry points the backend calls, by their exported names.
struct Cublas {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  cublasStatus_t (*gemm_strided_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                         const void*, const void*, cudaDataType, int, long long, const void*,
                                         cudaDataType, int, long long, const void*, void*, cudaDataType, int,
                                         long long, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
  std::string error;  // why it cannot be used; empty when every entry point was found
};

const Cublas& cublas() {
  static const Cublas api = [] {
    Cublas a;
    const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);  // kept loaded for the process
    if (!lib) {
      const char* why = dlerror();
      a.error = "cannot load cuBLAS (" + soname + ", CUDA " + std::to_string(CUBLAS_VER_MAJOR) +
                "): " + (why ? why : "not found") + "; put the CUDA libraries on LD_LIBRARY_PATH";
      return a;
    }
    auto find = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
      if (!fn && a.error.empty()) a.error = soname + " has no " + name + ": not the cuBLAS this memwall was built with";
    };
    find(a.create, "cublasCreate_v2");
    find(a.destroy, "cublasDestroy_v2");
    find(a.set_stream, "cublasSetStream_v2");
    find(a.set_workspace, "cublasSetWorkspace_v2");
    find(a.gemm_strided_batched, "cublasGemmStridedBatchedEx");
    find(a.status_string, "cublasGetStatusString");
    return a;
  }();
  return api;
}

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
    if (st_ != CUBLAS_STATUS_SUCCESS) record_error(c, std::string("cuBLAS ") + cublas().status_string(st_), __FILE__, __LINE__); \
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
  if (M <= 0 || N <= 0 || batch <= 0) return;  // nothing to write (K 0 only scales C, as cuBLAS does)
  CUBLAS_CHECK(c, cublas().gemm_strided_batched(c.blas, tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
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
  out[i] = wte[long(tok[bt]) * C + c] + (wpe ? wpe[long(bt % T) * C + c] : 0.0f);
}
// The encoder's gradients without atomics, each element summed in position order: the same bits
// every run. dwpe[t, c] += sum over b of dout[b, t, c]: one thread per (t, c).
__global__ void encoder_bwd_wpe_k(float* dwpe, const float* dout, int B, int T, int C) {
  long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= long(T) * C) return;
  float s = 0;
  for (int b = 0; b < B; ++b) s += dout[long(b) * T * C + i];
  dwpe[i] += s;
}
// dwte[v, c] += dout[bt, c] for every position bt with tok[bt] == v, in order of bt. Thread (c, s)
// owns the vocabulary rows v with v % slices == s of column c; a warp's 32 columns take the same
// branch at every position (coalesced, no divergence).
constexpr int kVocabSlices = 64;
__global__ void encoder_bwd_wte_k(float* dwte, const float* dout, const int* tok, int BT, int C) {
  const int c = blockIdx.x * 32 + threadIdx.x, slice = blockIdx.y;
  if (c >= C) return;
  for (int bt = 0; bt < BT; ++bt) {
    const int v = tok[bt];
    if (v % kVocabSlices == slice) dwte[long(v) * C + c] += dout[long(bt) * C + c];
  }
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
// dinp only, one warp per row; the weight and bias gradients are column sums (column_sums_k)
__global__ void layernorm_bwd_dinp_k(float* dinp, const float* dout, const float* inp, const float* w,
                                     const float* mean, const float* rstd, int BT, int C) {
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
  }
}

// RMSNorm, one warp per row: out = x * rstd * w
__global__ void rmsnorm_fwd_k(float* out, float* rstd, const float* inp, const float* w, int BT, int C) {
  int r = blockIdx.x, lane = threadIdx.x;
  if (r >= BT) return;
  const float* x = inp + long(r) * C;
  float ss = 0;
  for (int i = lane; i < C; i += 32) ss += x[i] * x[i];
  const float rs = rsqrtf(warp_sum(ss) / C + 1e-5f);
  for (int i = lane; i < C; i += 32) out[long(r) * C + i] = (x[i] * rs) * w[i];
  if (lane == 0) rstd[r] = rs;
}
// dinp only, one warp per row; the weight gradient is a column sum (column_sums_k, mean absent)
__global__ void rmsnorm_bwd_dinp_k(float* dinp, const float* dout, const float* inp, const float* w, const float* rstd,
                                   int BT, int C) {
  int r = blockIdx.x, lane = threadIdx.x;
  if (r >= BT) return;
  const float* x = inp + long(r) * C;
  const float* d = dout + long(r) * C;
  float a = 0;
  for (int i = lane; i < C; i += 32) a += w[i] * d[i] * (x[i] * rstd[r]);
  const float dn_norm_mean = warp_sum(a) / C;
  for (int i = lane; i < C; i += 32)
    dinp[long(r) * C + i] += (w[i] * d[i] - (x[i] * rstd[r]) * dn_norm_mean) * rstd[r];
}

// Rotary positions: one thread per (row, head, pair i) of the q and k heads, in place.
__global__ void rope_k(float* qkv, long BT, int T, int hs, int heads, int W, float theta, bool inverse) {
  const long n = long(blockIdx.x) * blockDim.x + threadIdx.x, half_hs = hs / 2;
  if (n >= BT * heads * half_hs) return;
  const long bt = n / (heads * half_hs);
  const int h = int(n / half_hs % heads), i = int(n % half_hs), t = int(bt % T);
  const double a = double(t) * pow(double(theta), -2.0 * i / hs);
  const float c = float(cos(a)), sn = inverse ? -float(sin(a)) : float(sin(a));
  float* x = qkv + bt * W + long(h) * hs;
  const float x1 = x[i], x2 = x[i + half_hs];
  x[i] = x1 * c - x2 * sn;
  x[i + half_hs] = x2 * c + x1 * sn;
}

// Column sums of a (rows, cols) matrix with row stride ld, added into out[col] (and, when inp is
// given, of dout * (inp - mean[r]) * rstd[r] into out2[col]: LayerNorm's weight gradient beside its
// bias gradient; mean nullptr: RMSNorm's, dout * inp * rstd[r], with out nullptr: no bias). A block owns 32 columns and every row: a warp reads 32 consecutive floats of a
// row (coalesced), the block's kColumnRows row groups are summed in shared memory in a fixed
// order, and each column is written once: no atomics, the same bits every run.
constexpr int kColumnRows = 16;
__global__ void column_sums_k(float* out, float* out2, const float* dout, const float* inp, const float* mean,
                              const float* rstd, int rows, int cols, int ld) {
  __shared__ float part[kColumnRows][32], part2[kColumnRows][32];
  const int col = blockIdx.x * 32 + threadIdx.x;
  float s = 0, s2 = 0;
  if (col < cols)
    for (int r = threadIdx.y; r < rows; r += kColumnRows) {
      const float d = dout[long(r) * ld + col];
      s += d;
      if (inp) s2 += d * ((inp[long(r) * ld + col] - (mean ? mean[r] : 0.0f)) * rstd[r]);
    }
  part[threadIdx.y][threadIdx.x] = s;
  part2[threadIdx.y][threadIdx.x] = s2;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    for (int k = 1; k < kColumnRows; ++k) s += part[k][threadIdx.x], s2 += part2[k][threadIdx.x];
    if (out) out[col] += s;
    if (out2) out2[col] += s2;
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
// Attention: q, k, v = qkv[b, t, 0:C], [C:2C], [2C:3C], head h at channels h*hs .. (h+1)*hs;
// att rows are (b, h, t), row r = (b * NH + h) * T + t. The four products are cuBLAS strided-
// batched GEMMs over the NH heads of one sequence (cu_att_*); these kernels are the row-wise
// softmax parts, one warp per row, each row's sums in a fixed order.

// att holds scale * q . k for every (t, t2) (the GEMM's full square): the causal softmax in place,
// zero above the diagonal
__global__ void causal_softmax_k(float* att, long rows, int T) {
  const long row = long(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = int(row % T);
  float* a = att + row * T;
  float maxv = -INFINITY;
  for (int t2 = lane; t2 <= t; t2 += 32) maxv = fmaxf(maxv, a[t2]);
  maxv = warp_max(maxv);
  float sum = 0;
  for (int t2 = lane; t2 <= t; t2 += 32) {
    const float e = expf(a[t2] - maxv);
    a[t2] = e;
    sum += e;
  }
  const float inv = 1.0f / warp_sum(sum);
  for (int t2 = lane; t2 < T; t2 += 32) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
}

// forward: att = softmax(pre), pre = scale * q . k. In place: datt[row, t2] becomes
// scale * dpre = scale * att * (datt - sum over t3 <= t of att * datt) for t2 <= t, 0 above.
__global__ void causal_softmax_bwd_k(float* datt, const float* att, long rows, int T, float scale) {
  const long row = long(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int t = int(row % T);
  const float* a = att + row * T;
  float* d = datt + row * T;
  float dot = 0;
  for (int t2 = lane; t2 <= t; t2 += 32) dot += a[t2] * d[t2];
  dot = warp_sum(dot);
  for (int t2 = lane; t2 < T; t2 += 32) d[t2] = t2 <= t ? scale * a[t2] * (d[t2] - dot) : 0.0f;
}

constexpr float kGeluS = 0.7978845608028654f;
__device__ float silu_d(float x) { return x / (1.0f + expf(-x)); }
__device__ float silu_grad_d(float x) {
  const float sg = 1.0f / (1.0f + expf(-x));
  return sg * (1.0f + x * (1.0f - sg));
}
__device__ float gelu_d(float x) { return 0.5f * x * (1.0f + tanhf(kGeluS * (x + 0.044715f * x * x * x))); }
__device__ float gelu_grad_d(float x) {
  const float th = tanhf(kGeluS * (x + 0.044715f * x * x * x));
  return 0.5f * (1.0f + th) + 0.5f * x * (1.0f - th * th) * kGeluS * (1.0f + 3.0f * 0.044715f * x * x);
}
__global__ void gelu_fwd_k(float* out, const float* inp, long N) {
  long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < N) out[i] = gelu_d(inp[i]);
}
__global__ void gelu_bwd_k(float* dinp, const float* inp, const float* dout, long N) {
  long i = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < N) dinp[i] += gelu_grad_d(inp[i]) * dout[i];
}
// out (BT, I) = act(gate) * up, inp (BT, 2I) = [gate, up] per row; one thread per output element
__global__ void glu_fwd_k(float* out, const float* inp, long BT, int I, bool use_gelu) {
  const long n = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= BT * I) return;
  const long r = n / I;
  const int i = int(n % I);
  const float g = inp[r * 2 * I + i], u = inp[r * 2 * I + I + i];
  out[n] = (use_gelu ? gelu_d(g) : silu_d(g)) * u;
}
__global__ void glu_bwd_k(float* dinp, const float* inp, const float* dout, long BT, int I, bool use_gelu) {
  const long n = long(blockIdx.x) * blockDim.x + threadIdx.x;
  if (n >= BT * I) return;
  const long r = n / I;
  const int i = int(n % I);
  const float g = inp[r * 2 * I + i], u = inp[r * 2 * I + I + i];
  dinp[r * 2 * I + i] += dout[n] * (use_gelu ? gelu_grad_d(g) : silu_grad_d(g)) * u;
  dinp[r * 2 * I + I + i] += dout[n] * (use_gelu ? gelu_d(g) : silu_d(g));
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
  g = __fmul_rn(g, s.inv_loss_scale);                                        // GradScaler.unscale_
  g = __fmul_rn(g, s.clip_coef);                                             // clip_grad_norm_
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

// Block b sums the squares of elements b * 256 + t + k * blocks * 256 (thread t, k = 0, 1, ...) in
// double, then the block's 256 sums in a fixed tree: the same bits on every call.
__global__ void sum_squares_k(double* partials, const void* x, adam::DType t, long n) {
  __shared__ double s[kThreads];
  double acc = 0;
  for (long i = long(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += long(gridDim.x) * blockDim.x) {
    const double v = half::element_f32(x, t, i);
    acc = fma(v, v, acc);
  }
  s[threadIdx.x] = acc;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w /= 2) {
    if (int(threadIdx.x) < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) partials[blockIdx.x] = s[0];
}
// Every launch goes through here: nothing is launched for zero work (a grid of 0 blocks is an
// error), and the launch is checked.
template <typename Kernel, typename... Args>
void launch(void* ctx, long blocks_, int threads, Kernel kernel, Args... args) {
  if (blocks_ <= 0) return;
  kernel<<<unsigned(blocks_), threads, 0, K(ctx)>>>(args...);
  LAUNCH_CHECK(X(ctx));
}
// one thread per element of n
template <typename Kernel, typename... Args>
void launch_n(void* ctx, long n, Kernel kernel, Args... args) {
  launch(ctx, n > 0 ? blocks(n, kThreads) : 0, kThreads, kernel, args...);
}
// one warp per row, 8 rows per block
template <typename Kernel, typename... Args>
void launch_rows(void* ctx, long rows, Kernel kernel, Args... args) {
  launch(ctx, (rows + 7) / 8, 256, kernel, args...);
}

void cu_encoder_fwd(void* ctx, float* out, const int* tok, const float* wte, const float* wpe, int B, int T, int C) {
  launch_n(ctx, long(B) * T * C, encoder_fwd_k, out, tok, wte, wpe, B * T, T, C);
}
void cu_encoder_bwd(void* ctx, float* dwte, float* dwpe, const float* dout, const int* tok, int B, int T, int C) {
  if (long(B) * T * C == 0) return;
  if (dwpe) launch_n(ctx, long(T) * C, encoder_bwd_wpe_k, dwpe, dout, B, T, C);
  encoder_bwd_wte_k<<<dim3(unsigned((C + 31) / 32), kVocabSlices), 32, 0, K(ctx)>>>(dwte, dout, tok, B * T, C);
  LAUNCH_CHECK(X(ctx));
}
void cu_ln_fwd(void* ctx, float* out, float* mean, float* rstd, const float* inp, const float* w, const float* b,
               int BT, int C) {
  if (C > 0) launch(ctx, BT, 32, layernorm_fwd_k, out, mean, rstd, inp, w, b, BT, C);
}
void column_sums(void* ctx, float* out, float* out2, const float* dout, const float* inp, const float* mean,
                 const float* rstd, int rows, int cols, int ld) {
  if (rows <= 0 || cols <= 0) return;
  column_sums_k<<<unsigned((cols + 31) / 32), dim3(32, kColumnRows), 0, K(ctx)>>>(out, out2, dout, inp, mean, rstd,
                                                                                 rows, cols, ld);
  LAUNCH_CHECK(X(ctx));
}
void cu_ln_bwd(void* ctx, float* dinp, float* dw, float* db, const float* dout, const float* inp, const float* w,
               const float* mean, const float* rstd, int BT, int C) {
  if (C <= 0) return;
  launch(ctx, BT, 32, layernorm_bwd_dinp_k, dinp, dout, inp, w, mean, rstd, BT, C);
  column_sums(ctx, db, dw, dout, inp, mean, rstd, BT, C, C);
}
void cu_rms_fwd(void* ctx, float* out, float* rstd, const float* inp, const float* w, int BT, int C) {
  if (C > 0) launch(ctx, BT, 32, rmsnorm_fwd_k, out, rstd, inp, w, BT, C);
}
void cu_rms_bwd(void* ctx, float* dinp, float* dw, const float* dout, const float* inp, const float* w,
                const float* rstd, int BT, int C) {
  if (C <= 0) return;
  launch(ctx, BT, 32, rmsnorm_bwd_dinp_k, dinp, dout, inp, w, rstd, BT, C);
  column_sums(ctx, nullptr, dw, dout, inp, nullptr, rstd, BT, C, C);
}
void cu_rope(void* ctx, float* qkv, int B, int T, int C, int NH, int KVH, float theta, bool inverse) {
  if (NH <= 0) return;
  const int hs = C / NH;
  launch_n(ctx, long(B) * T * (NH + KVH) * (hs / 2), rope_k, qkv, long(B) * T, T, hs, NH + KVH, C + 2 * KVH * hs,
           theta, inverse);
}
void cu_bias_fwd(void* ctx, float* out, const float* bias, int BT, int OC, int ldo) {
  launch_n(ctx, long(BT) * OC, bias_fwd_k, out, bias, BT, OC, ldo);
}
void cu_bias_bwd(void* ctx, float* dbias, const float* dout, int BT, int OC, int ldd) {
  column_sums(ctx, dbias, nullptr, dout, nullptr, nullptr, nullptr, BT, OC, ldd);
}

// The attention products, per sequence b, as GEMMs batched over heads. Query head h = g * G + j
// (G = NH / KVH query heads per key/value head g) is the (T, hs) block at channel h*hs of a (T, QW)
// row-major matrix, its key and value the blocks at C + g*hs and C + KVH*hs + g*hs; of out / dout, of
// a (T, C) one. One batched call per j covers the KVH heads g*G + j (MHA: G = 1, one call over every
// head): the calls of a gradient that several query heads share (dk, dv) run one after another on
// the stream, each adding into it. cu_gemm's row-major convention; each in the backend's compute type.
void cu_gemm(void* ctx, bool ta, bool tb, int M, int N, int K_, float alpha, const float* A, int lda, long sa,
             const float* B, int ldb, long sb, float beta, float* C, int ldc, long sc, int batch);
struct Heads {
  int T, C, NH, KVH, hs, G, W;
  Heads(int T_, int C_, int NH_, int KVH_)
      : T(T_), C(C_), NH(NH_), KVH(KVH_), hs(C_ / NH_), G(NH_ / KVH_), W(C_ + 2 * KVH_ * (C_ / NH_)) {}
  long tt() const { return long(T) * T; }
  // sequence b, query head j of each group; batch strides: q and att step over G heads, k and v one
  long q_at(int b, int j) const { return long(b) * T * W + long(j) * hs; }
  long k_at(int b) const { return long(b) * T * W + C; }
  long v_at(int b) const { return k_at(b) + long(KVH) * hs; }
  long att_at(int b, int j) const { return (long(b) * NH + j) * tt(); }
  long out_at(int b, int j) const { return long(b) * T * C + long(j) * hs; }
  long q_stride() const { return long(G) * hs; }
  long att_stride() const { return long(G) * tt(); }
};

void cu_att_scores_fwd(void* ctx, float* att, const float* qkv, int B, int T, int C, int NH, int KVH) {
  if (long(B) * NH * T == 0 || C == 0) return;
  const Heads h(T, C, NH, KVH);
  const float scale = 1.0f / sqrtf(float(h.hs));
  for (int b = 0; b < B; ++b)  // pre = scale * q . k^T, the full (T, T) square; the softmax masks it
    for (int j = 0; j < h.G; ++j)
      cu_gemm(ctx, false, true, T, T, h.hs, scale, qkv + h.q_at(b, j), h.W, h.q_stride(), qkv + h.k_at(b), h.W, h.hs,
              0.0f, att + h.att_at(b, j), T, h.att_stride(), KVH);
  launch_rows(ctx, long(B) * NH * T, causal_softmax_k, att, long(B) * NH * T, T);
}
void cu_att_context_fwd(void* ctx, float* out, const float* att, const float* qkv, int B, int T, int C, int NH,
                        int KVH) {
  if (long(B) * T * C == 0) return;
  const Heads h(T, C, NH, KVH);
  for (int b = 0; b < B; ++b)  // out = att . v (att is zero above the diagonal)
    for (int j = 0; j < h.G; ++j)
      cu_gemm(ctx, false, false, T, h.hs, T, 1.0f, att + h.att_at(b, j), T, h.att_stride(), qkv + h.v_at(b), h.W,
              h.hs, 0.0f, out + h.out_at(b, j), C, h.q_stride(), KVH);
}
void cu_att_context_bwd(void* ctx, float* datt, float* dqkv, const float* dout, const float* att, const float* qkv,
                        int B, int T, int C, int NH, int KVH) {
  if (long(B) * T * C == 0) return;
  const Heads h(T, C, NH, KVH);
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < h.G; ++j) {
      // datt += dout . v^T (the whole square: above the diagonal is scratch, backend.hpp)
      cu_gemm(ctx, false, true, T, T, h.hs, 1.0f, dout + h.out_at(b, j), C, h.q_stride(), qkv + h.v_at(b), h.W, h.hs,
              1.0f, datt + h.att_at(b, j), T, h.att_stride(), KVH);
      // dv += att^T . dout
      cu_gemm(ctx, true, false, T, h.hs, T, 1.0f, att + h.att_at(b, j), T, h.att_stride(), dout + h.out_at(b, j), C,
              h.q_stride(), 1.0f, dqkv + h.v_at(b), h.W, h.hs, KVH);
    }
}
void cu_att_scores_bwd(void* ctx, float* dqkv, float* datt, const float* att, const float* qkv, int B, int T, int C,
                       int NH, int KVH) {
  const long rows = long(B) * NH * T;
  if (rows == 0 || C == 0) return;
  const Heads h(T, C, NH, KVH);
  launch_rows(ctx, rows, causal_softmax_bwd_k, datt, att, rows, T, 1.0f / sqrtf(float(h.hs)));
  for (int b = 0; b < B; ++b)
    for (int j = 0; j < h.G; ++j) {
      const float* g = datt + h.att_at(b, j);  // scale * dpre, zero above the diagonal
      // dq += g . k;  dk += g^T . q
      cu_gemm(ctx, false, false, T, h.hs, T, 1.0f, g, T, h.att_stride(), qkv + h.k_at(b), h.W, h.hs, 1.0f,
              dqkv + h.q_at(b, j), h.W, h.q_stride(), KVH);
      cu_gemm(ctx, true, false, T, h.hs, T, 1.0f, g, T, h.att_stride(), qkv + h.q_at(b, j), h.W, h.q_stride(), 1.0f,
              dqkv + h.k_at(b), h.W, h.hs, KVH);
    }
}
void cu_gelu_fwd(void* ctx, float* out, const float* inp, long N) { launch_n(ctx, N, gelu_fwd_k, out, inp, N); }
void cu_gelu_bwd(void* ctx, float* dinp, const float* inp, const float* dout, long N) {
  launch_n(ctx, N, gelu_bwd_k, dinp, inp, dout, N);
}
void cu_glu_fwd(void* ctx, float* out, const float* inp, long BT, int I, bool use_gelu) {
  launch_n(ctx, BT * I, glu_fwd_k, out, inp, BT, I, use_gelu);
}
void cu_glu_bwd(void* ctx, float* dinp, const float* inp, const float* dout, long BT, int I, bool use_gelu) {
  launch_n(ctx, BT * I, glu_bwd_k, dinp, inp, dout, BT, I, use_gelu);
}
void cu_residual(void* ctx, float* out, const float* a, const float* b, long N) {
  launch_n(ctx, N, residual_k, out, a, b, N);
}
void cu_accumulate(void* ctx, float* dst, const float* src, long N) { launch_n(ctx, N, accumulate_k, dst, src, N); }
void cu_ce_fwd(void* ctx, float* probs, float* losses, const float* logits, const int* targets, int BT, int V) {
  if (V > 0) launch(ctx, BT, 32, crossentropy_fwd_k, probs, losses, logits, targets, BT, V);
}
void cu_ce_bwd(void* ctx, float* dlogits, const float* probs, const int* targets, float dloss, int BT, int V) {
  launch_n(ctx, long(BT) * V, crossentropy_bwd_k, dlogits, probs, targets, dloss, BT, V);
}

void cu_copy_fp32(void* ctx, void* dst, const void* src, long n) {
  CUDA_CHECK(X(ctx), cudaMemcpyAsync(dst, src, std::size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, K(ctx)));
}
void cu_to_fp32(void* ctx, float* dst, const void* src, adam::DType t, long n) {
  if (n <= 0) return;
  if (t == adam::DType::fp32) return cu_copy_fp32(ctx, dst, src, n);
  launch_n(ctx, n, to_fp32_k, dst, static_cast<const std::uint16_t*>(src), t, n);
}
void cu_from_fp32(void* ctx, void* dst, const float* src, adam::DType t, long n) {
  if (n <= 0) return;
  if (t == adam::DType::fp32) return cu_copy_fp32(ctx, dst, src, n);
  launch_n(ctx, n, from_fp32_k, static_cast<std::uint16_t*>(dst), src, t, n);
}
void cu_accumulate_to(void* ctx, void* dst, const float* src, adam::DType t, long n) {
  if (n <= 0) return;
  if (t == adam::DType::fp32) return cu_accumulate(ctx, static_cast<float*>(dst), src, n);
  launch_n(ctx, n, accumulate_to_k, static_cast<std::uint16_t*>(dst), src, t, n);
}

void cu_sum_squares(void* ctx, double* partials, int parts, const void* x, adam::DType t, long n) {
  if (parts < 1) return;
  launch(ctx, parts, kThreads, sum_squares_k, partials, x, t, n);
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
  if (!(d.loss_scale > 0 && std::isfinite(d.loss_scale)))
    return record_error(c, "adam_update: loss_scale: expected a finite value > 0, got " + std::to_string(d.loss_scale),
                        __FILE__, __LINE__);
  if (!(d.clip_coef >= 0 && std::isfinite(d.clip_coef)))
    return record_error(c, "adam_update: clip_coef: expected a finite value >= 0, got " + std::to_string(d.clip_coef),
                        __FILE__, __LINE__);
  adam::AdamOptions ao;
  ao.lr = d.lr;
  ao.beta1 = d.beta1;
  ao.beta2 = d.beta2;
  ao.eps = d.eps;
  ao.weight_decay = d.weight_decay;
  ao.decoupled_weight_decay = d.decoupled_weight_decay;
  adam::GradScaling gs;
  gs.loss_scale = d.loss_scale;
  gs.clip_coef = d.clip_coef;
  const adam::StepScalars s = adam::step_scalars(ao, d.step, gs);  // CpuAdam's constants, rounded alike
  adam_k<<<blocks(long(d.n), kThreads), kThreads, 0, K(ctx)>>>(d.param, d.exp_avg, d.exp_avg_sq, d.grad, d.grad_type,
                                                               static_cast<std::uint16_t*>(d.param16), d.param16_type,
                                                               d.n, s);
  LAUNCH_CHECK(c);
}

const char* cu_sticky_error(void* ctx) { return X(ctx).error.empty() ? nullptr : X(ctx).error.c_str(); }

void cu_destroy(void* ctx) {
  CudaCtx* c = static_cast<CudaCtx*>(ctx);
  cu_sync(ctx);
  if (c->blas) cublas().destroy(c->blas);
  for (auto& [p, n] : c->sizes) cudaFree(p);  // the cuBLAS workspace among them
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
    cu_rms_fwd,
    cu_rms_bwd,
    cu_rope,
cu_bias_fwd,
    cu_bias_bwd,
    cu_att_scores_fwd,
    cu_att_context_fwd,
    cu_att_context_bwd,
    cu_att_scores_bwd,
    cu_gelu_fwd,
    cu_gelu_bwd,
    cu_glu_fwd,
    cu_glu_bwd,
    cu_residual,
    cu_accumulate,
    cu_ce_fwd,
    cu_ce_bwd,
    cu_to_fp32,
    cu_from_fp32,
    cu_accumulate_to,
    cu_adam_update,
    cu_sum_squares,
    cu_sticky_error,
    cu_native_stream,
    nullptr,  // set_host_threads: the host runs no kernels
    cu_destroy,
};

// Why the CUDA runtime found no usable device, as what it is: "no CUDA device" only where there
// is none (no NVIDIA driver at all, or a driver that sees no GPU), which is the one case a test may
// skip for; a driver too old for this runtime, a device in use or broken are errors by name.
std::string no_device_or_error(cudaError_t e, int count) {
  if (e == cudaSuccess && count == 0) return "no CUDA device: the NVIDIA driver sees no GPU";
  if (e == cudaErrorNoDevice) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!driver) return "no CUDA device: no NVIDIA driver on this machine (libcuda.so.1 cannot be loaded)";
  dlclose(driver);
  int runtime = 0, supported = 0;
  cudaRuntimeGetVersion(&runtime);
  cudaDriverGetVersion(&supported);
  std::string what = std::string("CUDA device unusable: cudaGetDeviceCount: ") + cudaGetErrorName(e) + ": " +
                     cudaGetErrorString(e);
  if (e == cudaErrorInsufficientDriver)
    what += " (the driver supports CUDA " + std::to_string(supported / 1000) + "." + std::to_string(supported % 1000 / 10) +
            ", memwall was built with " + std::to_string(runtime / 1000) + "." + std::to_string(runtime % 1000 / 10) + ")";
  return what;
}

}  // namespace

std::string cuda_blas_error() { return cublas().error; }

std::string cuda_devices() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) return no_device_or_error(e, count);
  std::string out = std::to_string(count) + (count == 1 ? " device: " : " devices: ");
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    if ((e = cudaGetDeviceProperties(&prop, d)) != cudaSuccess)
      return out + "device " + std::to_string(d) + ": cudaGetDeviceProperties: " + cudaGetErrorName(e);
    char gib[32];
    std::snprintf(gib, sizeof gib, "%.1f", double(prop.totalGlobalMem) / double(1ull << 30));
    out += (d ? ", " : "") + std::string(prop.name) + " (" + gib + " GiB, compute " + std::to_string(prop.major) +
           "." + std::to_string(prop.minor) + ")";
  }
  return out;
}

// Bytes left to libraries that allocate device memory beside memwall (NCCL's buffers, the
// driver's own growth) when the capacity is the device's free memory: 1 GiB, or 1/16 of a
// smaller device.
constexpr std::size_t kLibraryReserve = std::size_t(1) << 30;

Result<std::unique_ptr<Backend>> create_cuda_backend(const BackendOptions& o) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) return make_error(no_device_or_error(e, count));
  const Cublas& blas = cublas();
  if (!blas.error.empty()) return make_error(blas.error);
  auto* c = new CudaCtx;
  auto fail = [c](const std::string& what) {
    cu_destroy(c);
    return make_error(what);
  };
  auto failed = [&](const char* call, cudaError_t err) {
    return fail(std::string(call) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
  };
  if (o.device < 0 || o.device >= count)
    return fail("cuda device " + std::to_string(o.device) + ": this machine has " + std::to_string(count));
  if ((e = cudaSetDevice(o.device)) != cudaSuccess) return failed("cudaSetDevice", e);
  cudaStream_t s;
  if ((e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) != cudaSuccess) return failed("cudaStreamCreate", e);
  c->streams.push_back(s);
  if (cublasStatus_t st = blas.create(&c->blas); st != CUBLAS_STATUS_SUCCESS) {
    c->blas = nullptr;
    return fail(std::string("cublasCreate: ") + blas.status_string(st));
  }
  if (cublasStatus_t st = blas.set_stream(c->blas, s); st != CUBLAS_STATUS_SUCCESS)
    return fail(std::string("cublasSetStream: ") + blas.status_string(st));
  // free memory with the context and cuBLAS made: what memwall may use, less the libraries' reserve
  std::size_t free_b = 0, total_b = 0;
  if ((e = cudaMemGetInfo(&free_b, &total_b)) != cudaSuccess) return failed("cudaMemGetInfo", e);
  const std::size_t reserve = std::min(kLibraryReserve, total_b / 16);
  const std::size_t usable = free_b > reserve ? free_b - reserve : 0;
  c->capacity_bytes = o.capacity_bytes ? std::min(o.capacity_bytes, usable) : usable;
  Result<void*> ws = cu_alloc(c, backend_reserved_bytes("cuda", c->capacity_bytes));  // cuBLAS's workspace
  if (!ws) return fail("cuBLAS workspace: " + ws.error());
  c->blas_workspace = *ws;
  if (cublasStatus_t st = blas.set_workspace(c->blas, *ws, c->sizes[*ws]); st != CUBLAS_STATUS_SUCCESS)
    return fail(std::string("cublasSetWorkspace: ") + blas.status_string(st));
  c->compute = o.compute == ComputeType::fp16   ? CUBLAS_COMPUTE_32F_FAST_16F
               : o.compute == ComputeType::bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF
                                                : CUBLAS_COMPUTE_32F;
  cudaDeviceProp prop{};
  if ((e = cudaGetDeviceProperties(&prop, o.device)) != cudaSuccess) return failed("cudaGetDeviceProperties", e);
  BackendCaps caps{"cuda", prop.name, c->capacity_bytes, c->used, true, true, true, o.compute, total_b, free_b, reserve};
  return std::make_unique<Backend>(&kCudaOps, c, std::move(caps));
}

}  // namespace memwall::exec
