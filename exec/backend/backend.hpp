// Backend: the executor's view of one compute device, in the spirit of ggml-backend: an opaque
// handle, a table of operations (some optional) and a capabilities struct. Owns device memory
// (allocated on the device tier against a hard capacity), streams, events, GEMM, the GPT kernels,
// fp32 <-> fp16/bf16 conversions and (optionally) an Adam step on device memory.
// Does not own: what is allocated (the caller frees it), the schedule, host buffers.
// Thread-safety: one thread drives a backend; copies run asynchronously on the backend's streams.
//
// Conventions for every kernel: device pointers to fp32 row-major arrays unless a dtype says
// otherwise; kernels run in order on the backend's compute stream (stream 0). Key to the shape letters:
//   B batch, T sequence length, C channels, NH heads, KVH key/value heads (a divisor of NH; NH:
//   multi-head attention), hs = C / NH head size, QW = C + 2*KVH*hs the width of a qkv row, I a
//   feed-forward's inner size, V vocabulary (256: bytes), BT = B*T, OC output channels of a linear layer.
// Backward kernels ACCUMULATE (+=) into the gradients they write, as llm.c's do, so a parameter
// or activation used twice (the tied embedding, the residual stream) sums its gradients.
// Attention is two operators, as in the operator graph (model/): attn_scores (qkv -> att, the
// causal softmax) and attn_context (att, qkv -> out); each has a forward and a backward kernel,
// and the scores backward reads the datt the context backward accumulated. Grouped-query attention:
// query head h reads key/value head h / (NH / KVH).
// Mixed precision: 16-bit parameters and gradients live in buffers of adam::DType; compute is
// fp32, through to_fp32 / from_fp32 / accumulate_to, which round exactly as CpuAdam's copy does.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "exec/adam/adam_types.hpp"
#include "model/result.hpp"

namespace memwall::exec {

enum class ComputeType { fp32, fp16, bf16 };  // what GEMMs compute in (accumulation is fp32)
const char* compute_type_name(ComputeType t);
Result<ComputeType> parse_compute_type(const std::string& s);

struct BackendCaps {
  std::string name;            // "cpu", "cuda"
  std::string device;          // human-readable device description
  std::size_t capacity_bytes;  // hard limit of alloc() in total, the backend's own workspaces included
  std::size_t reserved_bytes;  // of that, what the backend holds from creation on for its own work
                               // (cuda: the cuBLAS workspace); used_bytes() counts it
  bool async_copy;             // copies overlap compute
  bool fp16_compute;           // GEMM can compute in fp16 / bf16 with fp32 accumulation
  bool bf16_compute;
  ComputeType compute;         // what this instance's GEMMs compute in
  // cuda: the whole device, what was free once the context and cuBLAS were made, and the margin
  // left free beside capacity for NCCL and the driver (calibrate writes them as gpu.reserve); 0 on cpu
  std::size_t device_total_bytes = 0;
  std::size_t device_free_bytes = 0;
  std::size_t kept_free_bytes = 0;
};

struct BackendOptions {
  std::size_t capacity_bytes = 0;       // 0: cpu = 1 GiB, cuda = free device memory less a reserve
                                        // for what libraries allocate beside memwall (NCCL's buffers)
  ComputeType compute = ComputeType::fp32;
  int copy_threads = 2;                 // cpu: worker threads behind the copy streams
  int device = 0;                       // cuda: which GPU (one per data-parallel rank of a node)
  int threads = 0;                      // cpu: threads of its kernels (OpenMP, OpenBLAS) and adam_update;
                                        // 0 = every core this process may use (adam/host_cores.hpp)
};

using Stream = int;   // 0 = compute stream; stream_create() gives copy streams 1, 2, ...
using Event = void*;  // opaque; each backend defines what it points to

// One Adam/AdamW step over n elements of device memory, torch's formula (torch.optim.Adam with
// decoupled_weight_decay false, AdamW with true; see exec/adam/cpu_adam.hpp for the rounding).
struct DeviceAdam {
  float* param = nullptr;        // (n) fp32 master parameters, updated in place
  float* exp_avg = nullptr;      // (n) momentum, updated in place
  float* exp_avg_sq = nullptr;   // (n) variance, updated in place
  const void* grad = nullptr;    // (n) of grad_type; read only
  adam::DType grad_type = adam::DType::fp32;
  void* param16 = nullptr;       // (n) of param16_type (fp16 or bf16): the updated parameters,
                                 // rounded as from_fp32 rounds, written in the same pass; nullptr = none
  adam::DType param16_type = adam::DType::bf16;
  std::size_t n = 0;
  long step = 1;                 // the step number after incrementing (>= 1): bias corrections
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decoupled_weight_decay = false;
  // applied to the gradient first, as CpuAdam's GradScaling: grad * float(1 / loss_scale), then
  // * clip_coef (clip_grad_norm_'s clamped coefficient)
  double loss_scale = 1.0;  // > 0
  double clip_coef = 1.0;   // >= 0
};

// The operations table. Entries marked optional may be nullptr; the free functions below fall
// back or report "not supported". Every pointer argument is device memory unless named host_*.
struct BackendOps {
  // memory on the device tier, 256-byte aligned; alloc fails (never aborts) when capacity would be exceeded
  Result<void*> (*alloc)(void* ctx, std::size_t bytes);
  void (*free)(void* ctx, void* ptr);
  std::size_t (*used_bytes)(void* ctx);
  void (*memset_zero)(void* ctx, void* ptr, std::size_t bytes);  // on the compute stream

  // streams and events
  Result<Stream> (*stream_create)(void* ctx);
  void (*copy_h2d_async)(void* ctx, Stream s, void* dst, const void* host_src, std::size_t bytes);
  void (*copy_d2h_async)(void* ctx, Stream s, void* host_dst, const void* src, std::size_t bytes);
  void (*copy_d2d_async)(void* ctx, Stream s, void* dst, const void* src, std::size_t bytes);
  Event (*event_create)(void* ctx);
  void (*event_destroy)(void* ctx, Event e);
  void (*event_record)(void* ctx, Event e, Stream s);    // completes when s reaches this point
  void (*event_synchronize)(void* ctx, Event e);         // host waits
  // non-blocking: true when the stream has reached the last record of e (or e was never
  // recorded); false while it is still pending. A failed query counts as reached (cuda records
  // it as the sticky error), so a caller polling for completion never spins forever.
  bool (*event_query)(void* ctx, Event e);
  void (*stream_wait_event)(void* ctx, Stream s, Event e);
  void (*synchronize)(void* ctx);                        // host waits for every stream
  // optional: pin host memory so copies from it are truly asynchronous (cudaHostRegister)
  Result<bool> (*host_register)(void* ctx, void* host_ptr, std::size_t bytes);
  void (*host_unregister)(void* ctx, void* host_ptr);

  // C[b] = alpha * op(A[b]) op(B[b]) + beta * C[b], row-major, op(A) (M,K), op(B) (K,N), C (M,N),
  // for b < batch with element strides stride_a/b/c between batches.
  void (*gemm)(void* ctx, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A, int lda,
               long stride_a, const float* B, int ldb, long stride_b, float beta, float* C, int ldc, long stride_c,
               int batch);

  // GPT kernels, forward/backward pairs; the CPU backend (backend_cpu.cpp) is the reference.
  // out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]; wpe nullptr (rotary positions): no position term,
  // and the backward's dwpe is nullptr too
  void (*encoder_forward)(void* ctx, float* out, const int* tokens, const float* wte, const float* wpe, int B, int T,
                          int C);
  void (*encoder_backward)(void* ctx, float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T,
                           int C);
  void (*layernorm_forward)(void* ctx, float* out, float* mean, float* rstd, const float* inp, const float* weight,
                            const float* bias, int BT, int C);
  void (*layernorm_backward)(void* ctx, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                             const float* weight, const float* mean, const float* rstd, int BT, int C);
  // RMSNorm: out = x * rstd * weight, rstd = 1 / sqrt(mean over C of x^2 + 1e-5) (one per row, kept
  // for the backward); dinp += rstd * (dn - n * mean(dn * n)) with n = x * rstd, dn = dout * weight;
  // dweight += sum over rows of dout * n
  void (*rmsnorm_forward)(void* ctx, float* out, float* rstd, const float* inp, const float* weight, int BT, int C);
  void (*rmsnorm_backward)(void* ctx, float* dinp, float* dweight, const float* dout, const float* inp,
                           const float* weight, const float* rstd, int BT, int C);
  // Rotary positions in place on the q and k heads of qkv (B, T, QW) (or of its gradient): each
  // head's channel pairs (i, i + hs/2), i < hs/2 (the rotate_half convention of Hugging Face's
  // Llama), turned by the angle t * theta^(-2i/hs) at position t; inverse turns them back by the
  // same angle, which is the backward (a rotation's transpose is its inverse). hs even.
  void (*rope)(void* ctx, float* qkv, int B, int T, int C, int NH, int KVH, float theta, bool inverse);
  // out[r * ldo + o] += bias[o] for r < BT, o < OC: the bias of OC output columns inside a
  // (BT, ldo) output (ldo = OC for a whole layer, wider for one tile of its columns)
  void (*bias_forward)(void* ctx, float* out, const float* bias, int BT, int OC, int ldo);
  // forward: out[r * ldo + o] += bias[o]; dbias[o] += sum over r < BT of dout[r * ldd + o]
  void (*bias_backward)(void* ctx, float* dbias, const float* dout, int BT, int OC, int ldd);
  // Causal softmax attention in two operators. q, k, v = qkv[b, t, 0:C], [C:C+KVH*hs],
  // [C+KVH*hs:QW]; query head h at channels h*hs .. (h+1)*hs of q, its key/value head g = h/(NH/KVH)
  // at g*hs .. (g+1)*hs of k and v (below, "k[b,t2,h]" means that one).
  // att is always a causal softmax (zero above the diagonal, as attention_scores_forward leaves it):
  // the kernels that read it may multiply by those zeros (the cuda backend's products are GEMMs over
  // the whole (T, T) square).
  // attn_scores: att (B, NH, T, T)[b, h, t, t2] = softmax over t2 <= t of q[b,t,h] . k[b,t2,h] /
  // sqrt(hs), zero above the diagonal (t2 > t); att is overwritten.
  void (*attention_scores_forward)(void* ctx, float* att, const float* qkv, int B, int T, int C, int NH, int KVH);
  // attn_context: out (B, T, C)[b, t, h] = sum over t2 <= t of att[b, h, t, t2] * v[b, t2, h];
  // out is overwritten.
  void (*attention_context_forward)(void* ctx, float* out, const float* att, const float* qkv, int B, int T, int C,
                                    int NH, int KVH);
  // forward: out[b,t,h] = sum_t2 att[b,h,t,t2] * v[b,t2,h]
  // datt (B, NH, T, T)[b,h,t,t2] += dout[b,t,h] . v[b,t2,h] for t2 <= t (above the diagonal is
  // scratch: a backend may leave it or add into it); dv (the v part of dqkv (B, T, QW)) += att^T . dout,
  // summed over the query heads that share it
  void (*attention_context_backward)(void* ctx, float* datt, float* dqkv, const float* dout, const float* att,
                                     const float* qkv, int B, int T, int C, int NH, int KVH);
  // forward: att[b,h,t,:] = softmax(pre), pre[t2] = scale * q[b,t,h] . k[b,t2,h], scale = 1/sqrt(hs)
  // dpre[t2] = att[t2] * (datt[t2] - sum over t3 <= t of att[t3] * datt[t3]) for t2 <= t;
  // dq (0:C of dqkv) += scale * dpre . k; dk (the k part) += scale * dpre^T . q over the heads
  // that share it. dv is not touched.
  // datt is read on and below the diagonal and is scratch afterwards (cuda keeps scale * dpre in it).
  void (*attention_scores_backward)(void* ctx, float* dqkv, float* datt, const float* att, const float* qkv,
                                    int B, int T, int C, int NH, int KVH);
  void (*gelu_forward)(void* ctx, float* out, const float* inp, long N);
  void (*gelu_backward)(void* ctx, float* dinp, const float* inp, const float* dout, long N);
  // A gated feed-forward's activation: inp (BT, 2I) holds the gate [0, I) then the up projection
  // [I, 2I) of each row; out (BT, I) = act(gate) * up, act SiLU (SwiGLU) or, with gelu, GeLU's tanh
  // approximation (GeGLU). The backward adds d(gate) and d(up) into dinp (BT, 2I).
  void (*glu_forward)(void* ctx, float* out, const float* inp, long BT, int I, bool gelu);
  void (*glu_backward)(void* ctx, float* dinp, const float* inp, const float* dout, long BT, int I, bool gelu);
  void (*residual_forward)(void* ctx, float* out, const float* inp1, const float* inp2, long N);
  void (*accumulate)(void* ctx, float* dst, const float* src, long N);  // residual backward: dst += src
  // softmax over V of logits (BT, V) into probs, loss per position into losses (BT)
  void (*crossentropy_forward)(void* ctx, float* probs, float* losses, const float* logits, const int* targets, int BT,
                               int V);
  // dlogits += (probs - onehot(targets)) * dloss
  void (*crossentropy_backward)(void* ctx, float* dlogits, const float* probs, const int* targets, float dloss, int BT,
                                int V);

  // 16-bit buffers (n elements; fp32 = 4 bytes, fp16 / bf16 = 2). Rounding: to nearest even, NaN
  // stays NaN, fp16 overflow to inf and subnormals kept, bit for bit as CpuAdam's 16-bit copy
  // (exec/backend/half.hpp); fp32 -> fp32 is a copy.
  void (*to_fp32)(void* ctx, float* dst, const void* src, adam::DType src_type, long n);    // dst = float(src)
  void (*from_fp32)(void* ctx, void* dst, const float* src, adam::DType dst_type, long n);  // dst = round(src)
  // dst = round(float(dst) + src): a 16-bit gradient buffer summing an fp32 gradient (fp32: dst += src);
  // a NaN sum has x86's bits on every backend (half.hpp, add_f32)
  void (*accumulate_to)(void* ctx, void* dst, const float* src, adam::DType dst_type, long n);

  // optional: one Adam step on device memory, in order on the compute stream. cpu: CpuAdam's
  // kernels, bit for bit CpuAdam::step with the same options; cuda: the same formula and order of
  // roundings in CUDA's IEEE-rounded intrinsics. Invalid arguments (step < 1, param16_type fp32)
  // are reported through sticky_error and update nothing.
  void (*adam_update)(void* ctx, const DeviceAdam& a);
  // Sums of squares of n elements of type t, each widened to fp32 and squared and summed in double,
  // into partials[0..parts) (device memory; parts >= 1): part p of a partition fixed by n and parts
  // alone, so a call gives the same bits every time; the caller adds the parts in order (gradient
  // clipping's global norm). On the compute stream.
  void (*sum_squares)(void* ctx, double* partials, int parts, const void* x, adam::DType t, long n);
// optional: the first failure of a call that returns nothing (a kernel or copy that went wrong
  // after its call returned, an adam_update refused), with file:line where there is one; nullptr
  // when there was none. Checked after each training step.
  const char* (*sticky_error)(void* ctx);

  // optional: the device API's own handle of a stream (cudaStream_t on cuda), for libraries that
  // enqueue work on it themselves (NCCL); nullptr where there is none
  void* (*native_stream)(void* ctx, Stream s);

  // optional: the host threads the backend's own CPU work uses from its next call on (cpu: the
  // kernels' OpenMP team, OpenBLAS, adam_update), n >= 1; the engine fits it to the cores other
  // processes leave free. nullptr where the host does no parallel work (cuda).
  void (*set_host_threads)(void* ctx, int n);

  void (*destroy)(void* ctx);
};

// A backend instance: the opaque handle every layer above holds.
class Backend {
 public:
  Backend(const BackendOps* ops, void* ctx, BackendCaps caps) : ops_(ops), ctx_(ctx), caps_(std::move(caps)) {}
  ~Backend() { ops_->destroy(ctx_); }
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  const BackendOps& ops() const { return *ops_; }
  void* ctx() const { return ctx_; }
  const BackendCaps& caps() const { return caps_; }

 private:
  const BackendOps* ops_;
  void* ctx_;
  BackendCaps caps_;
};

// What create_backend(name) keeps of a capacity for the backend's own work (its
// BackendCaps::reserved_bytes), known before it is made so a memory plan can leave it free. cuda:
// cuBLAS's workspace, 32 MiB as NVIDIA recommends on Hopper, or 1/16 of a capacity under 512 MiB
// (in 256-byte units; the tests' 64 MiB devices keep 4 MiB, cuBLAS's own default pool). cpu: none.
std::size_t backend_reserved_bytes(const std::string& name, std::size_t capacity_bytes);

// The sum of squares of n elements of type t in host memory, each widened to fp32, squared and
// summed in double (eight interleaved sums, added in order: the same bits on every call): what the
// engine adds for gradients it holds in CPU memory, and each part of the cpu backend's sum_squares.
double host_sum_squares(const void* x, adam::DType t, std::size_t n);

// Backends compiled into this build ("cpu", and "cuda" when the toolkit was found).
std::vector<std::string> compiled_backends();
// Creates one; a compiled backend without its device is an error whose message says so.
Result<std::unique_ptr<Backend>> create_backend(const std::string& name, const BackendOptions& options = {});
// The cuda backend loads cuBLAS when the first one is made, not when memwall starts (its libraries'
// start-up would fall on every command): loads it now, device or not, and says why it cannot be
// used ("" when it can; "" too in a build without the cuda backend).
std::string cuda_libraries_error();
// What `memwall --version` says of the backends: those compiled, the CUDA devices this machine has
// (names, memory, compute capability) or why it has none, and whether cuBLAS loads (it loads it).
std::string backends_report();

// Typed helpers over the table.
template <typename T>
Result<T*> alloc_array(Backend& b, std::size_t n) {
  Result<void*> p = b.ops().alloc(b.ctx(), n * sizeof(T));
  if (!p) return make_error(p.error());
  return static_cast<T*>(*p);
}

}  // namespace memwall::exec
