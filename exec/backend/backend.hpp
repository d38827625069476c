// Backend: the executor's view of one compute device, in the spirit of ggml-backend: an opaque
// handle, a table of operations (some optional) and a capabilities struct. Owns device memory
// (allocated on the device tier against a hard capacity), streams, events, GEMM and the GPT kernels.
// Does not own: what is allocated (the caller frees it), the schedule, host buffers.
// Thread-safety: one thread drives a backend; copies run asynchronously on the backend's streams.
//
// Conventions for every kernel: device pointers to fp32 row-major arrays; kernels run in order on
// the backend's compute stream (stream 0). Key to the shape letters:
//   B batch, T sequence length, C channels, NH heads, V vocabulary (256: bytes), BT = B*T.
// Backward kernels ACCUMULATE (+=) into the gradients they write, as llm.c's do, so a parameter
// or activation used twice (the tied embedding, the residual stream) sums its gradients.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "model/result.hpp"

namespace memwall::exec {

enum class ComputeType { fp32, fp16, bf16 };  // what GEMMs compute in (accumulation is fp32)
const char* compute_type_name(ComputeType t);
Result<ComputeType> parse_compute_type(const std::string& s);

struct BackendCaps {
  std::string name;            // "cpu", "cuda"
  std::string device;          // human-readable device description
  std::size_t capacity_bytes;  // hard limit of alloc() in total
  bool async_copy;             // copies overlap compute
  bool fp16_compute;           // GEMM can compute in fp16 / bf16 with fp32 accumulation
  bool bf16_compute;
  ComputeType compute;         // what this instance's GEMMs compute in
};

struct BackendOptions {
  std::size_t capacity_bytes = 0;       // 0: cpu = 1 GiB, cuda = free device memory
  ComputeType compute = ComputeType::fp32;
  int copy_threads = 2;                 // cpu: worker threads behind the copy streams
};

using Stream = int;   // 0 = compute stream; stream_create() gives copy streams 1, 2, ...
using Event = void*;  // opaque; each backend defines what it points to

// The operations table. Entries marked optional may be nullptr; the free functions below fall
// back or report "not supported". Every pointer argument is device memory unless named host_*.
struct BackendOps {
  // memory on the device tier; alloc fails (never aborts) when capacity would be exceeded
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

  // GPT kernels, forward/backward pairs; the CPU backend (backend_cpu.cpp) is the reference
  void (*encoder_forward)(void* ctx, float* out, const int* tokens, const float* wte, const float* wpe, int B, int T,
                          int C);
  void (*encoder_backward)(void* ctx, float* dwte, float* dwpe, const float* dout, const int* tokens, int B, int T,
                           int C);
  void (*layernorm_forward)(void* ctx, float* out, float* mean, float* rstd, const float* inp, const float* weight,
                            const float* bias, int BT, int C);
  void (*layernorm_backward)(void* ctx, float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                             const float* weight, const float* mean, const float* rstd, int BT, int C);
  void (*bias_forward)(void* ctx, float* out, const float* bias, int BT, int OC);     // out += bias
  void (*bias_backward)(void* ctx, float* dbias, const float* dout, int BT, int OC);  // dbias += sum dout
  // causal softmax attention: qkv (B, T, 3C) -> out (B, T, C), att (B, NH, T, T) kept for backward
  // (zero above the diagonal)
  void (*attention_forward)(void* ctx, float* out, float* att, const float* qkv, int B, int T, int C, int NH);
  void (*attention_backward)(void* ctx, float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                             int T, int C, int NH);
  void (*gelu_forward)(void* ctx, float* out, const float* inp, long N);
  void (*gelu_backward)(void* ctx, float* dinp, const float* inp, const float* dout, long N);
  void (*residual_forward)(void* ctx, float* out, const float* inp1, const float* inp2, long N);
  void (*accumulate)(void* ctx, float* dst, const float* src, long N);  // residual backward: dst += src
  // softmax over V of logits (BT, V) into probs, loss per position into losses (BT)
  void (*crossentropy_forward)(void* ctx, float* probs, float* losses, const float* logits, const int* targets, int BT,
                               int V);
  // dlogits += (probs - onehot(targets)) * dloss
  void (*crossentropy_backward)(void* ctx, float* dlogits, const float* probs, const int* targets, float dloss, int BT,
                                int V);

  // optional: the first asynchronous failure (a kernel or copy that went wrong after its call
  // returned), with file:line; nullptr when there was none. Checked after each training step.
  const char* (*sticky_error)(void* ctx);

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

// Backends compiled into this build ("cpu", and "cuda" when the toolkit was found).
std::vector<std::string> compiled_backends();
// Creates one; a compiled backend without its device is an error whose message says so.
Result<std::unique_ptr<Backend>> create_backend(const std::string& name, const BackendOptions& options = {});

// Typed helpers over the table.
template <typename T>
Result<T*> alloc_array(Backend& b, std::size_t n) {
  Result<void*> p = b.ops().alloc(b.ctx(), n * sizeof(T));
  if (!p) return make_error(p.error());
  return static_cast<T*>(*p);
}

}  // namespace memwall::exec
