// NCCL collectives between the GPUs of an MPI job: one communicator over the world (unique id from
// rank 0, broadcast over MPI), a stream of their own that waits for the compute stream before each
// collective, and an event per operation the dispatcher polls (cudaEventQuery, plus
// ncclCommGetAsyncError so a broken peer is an error, never a hang). Built with the cuda backend.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <memory>

#include "exec/engine/collectives.hpp"
#include "exec/adam/cpu_adam.hpp"

namespace memwall::exec {
namespace {

#define NCCL_CHECK(call)                                                                                        \
  do {                                                                                                          \
    ncclResult_t nccl_rc_ = (call);                                                                             \
    if (nccl_rc_ != ncclSuccess)                                                                                \
      return make_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #call ": " +             \
                        ncclGetErrorString(nccl_rc_));                                                          \
  } while (0)
#define CUDA_CHECK(call)                                                                                        \
  do {                                                                                                          \
    cudaError_t cuda_rc_ = (call);                                                                              \
    if (cuda_rc_ != cudaSuccess)                                                                                \
      return make_error(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #call ": " +             \
                        cudaGetErrorString(cuda_rc_));                                                          \
  } while (0)

ncclDataType_t nccl_type(adam::DType t) {
  return t == adam::DType::fp32 ? ncclFloat32 : t == adam::DType::bf16 ? ncclBfloat16 : ncclFloat16;
}

// The communicator and whether it failed: after an error (a collective that returned one, an
// asynchronous error, an operation abandoned for a stopped rank) the communicator is aborted, not
// destroyed (ncclCommDestroy would wait for peers that may never come), and the kernels it had
// queued end, so waiting on their events cannot hang.
struct Comm {
  ncclComm_t comm = nullptr;
  bool aborted = false;
  void abort() {
    if (!aborted && comm) ncclCommAbort(comm);
    aborted = true;
  }
};

class NcclOp : public CollectiveOp {
 public:
  NcclOp(std::shared_ptr<Comm> comm, cudaEvent_t ev) : comm_(std::move(comm)), ev_(ev) {}
  ~NcclOp() override {
    if (!comm_->aborted) cudaEventSynchronize(ev_);  // never leave NCCL writing into freed memory
    cudaEventDestroy(ev_);
  }
  Result<bool> test() override {
    if (comm_->aborted) return make_error("NCCL: the communicator was aborted after an earlier failure");
    cudaError_t e = cudaEventQuery(ev_);
    if (e == cudaSuccess) return true;
    if (e != cudaErrorNotReady) {
      comm_->abort();
      return make_error(std::string("cudaEventQuery: ") + cudaGetErrorString(e));
    }
    ncclResult_t async = ncclSuccess;
    if (ncclResult_t r = ncclCommGetAsyncError(comm_->comm, &async); r != ncclSuccess) async = r;
    if (async != ncclSuccess && async != ncclInProgress) {
      comm_->abort();
      return make_error(std::string("NCCL: ") + ncclGetErrorString(async) + " (the communicator is aborted)");
    }
    return false;
  }
  void abandon() override { comm_->abort(); }

 private:
  std::shared_ptr<Comm> comm_;
  cudaEvent_t ev_;
};

class NcclCollectives : public Collectives {
 public:
  NcclCollectives(Collectives& boot, ncclComm_t comm, cudaStream_t compute, cudaStream_t comm_stream,
                  std::size_t free_before)
      : boot_(boot), comm_(std::make_shared<Comm>(Comm{comm})), compute_(compute), stream_(comm_stream),
        free_before_(free_before) {}
  ~NcclCollectives() override {
    if (comm_->aborted) return;
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_->comm);
  }
  int rank() const override { return boot_.rank(); }
  int size() const override { return boot_.size(); }
  std::string name() const override { return "nccl"; }
  std::size_t device_bytes() const override {
    std::size_t free_now = 0, total = 0;
    if (free_before_ == 0 || cudaMemGetInfo(&free_now, &total) != cudaSuccess) return 0;
    return free_before_ > free_now ? free_before_ - free_now : 0;
  }

  Result<std::unique_ptr<CollectiveOp>> all_gather(void* base, std::size_t count, std::size_t stride,
                                                   adam::DType t, const void* send) override {
    if (Result<bool> r = after_compute(); !r) return make_error(r.error());
    char* b = static_cast<char*>(base);
    const std::size_t eb = adam::dtype_bytes(t);
    const void* mine = send ? send : b + std::size_t(rank()) * stride * eb;
    if (stride == count) {  // in place: sendbuff == recvbuff + rank * count
      if (Result<bool> r = enqueued(ncclAllGather(mine, b, count, nccl_type(t), comm(), stream_), "ncclAllGather"); !r)
        return make_error(r.error());
    } else {  // NCCL has no strided all-gather: one broadcast per rank, grouped
      // every ncclGroupStart is ended, also when a call inside failed (the first error is reported)
      NCCL_CHECK(ncclGroupStart());
      ncclResult_t first = ncclSuccess;
      for (int q = 0; q < size() && first == ncclSuccess; ++q)
        first = ncclBroadcast(q == rank() ? mine : b + std::size_t(q) * stride * eb, b + std::size_t(q) * stride * eb,
                              count, nccl_type(t), q, comm(), stream_);
      const ncclResult_t end = ncclGroupEnd();
      if (first != ncclSuccess || end != ncclSuccess) {
        comm_->abort();
        return make_error(std::string("ncclBroadcast (grouped, strided all-gather): ") +
                          ncclGetErrorString(first != ncclSuccess ? first : end) + " (the communicator is aborted)");
      }
    }
    return done_op();
  }
  Result<std::unique_ptr<CollectiveOp>> reduce_scatter(void* buf, void* out, std::size_t count,
                                                       adam::DType t) override {
    if (Result<bool> r = after_compute(); !r) return make_error(r.error());
    char* slice = static_cast<char*>(buf) + std::size_t(rank()) * count * adam::dtype_bytes(t);
    if (Result<bool> r = enqueued(ncclReduceScatter(buf, slice, count, nccl_type(t), ncclSum, comm(), stream_), "ncclReduceScatter"); !r)
      return make_error(r.error());
    if (out != slice) CUDA_CHECK(cudaMemcpyAsync(out, slice, count * adam::dtype_bytes(t), cudaMemcpyDeviceToDevice, stream_));
    return done_op();
  }
  Result<std::unique_ptr<CollectiveOp>> all_reduce(void* buf, std::size_t count, adam::DType t) override {
    if (Result<bool> r = after_compute(); !r) return make_error(r.error());
    if (Result<bool> r = enqueued(ncclAllReduce(buf, buf, count, nccl_type(t), ncclSum, comm(), stream_), "ncclAllReduce"); !r)
      return make_error(r.error());
    return done_op();
  }
  Result<std::unique_ptr<CollectiveOp>> broadcast(void* buf, std::size_t count, adam::DType t, int root) override {
    if (Result<bool> r = after_compute(); !r) return make_error(r.error());
    if (Result<bool> r = enqueued(ncclBroadcast(buf, buf, count, nccl_type(t), root, comm(), stream_), "ncclBroadcast"); !r)
      return make_error(r.error());
    return done_op();
  }
  Result<std::unique_ptr<CollectiveOp>> send(const void* buf, std::size_t count, adam::DType t, int peer) override {
    if (Result<bool> r = after_compute(); !r) return make_error(r.error());
    if (Result<bool> r = enqueued(ncclSend(buf, count, nccl_type(t), peer, comm(), stream_), "ncclSend"); !r)
      return make_error(r.error());
    return done_op();
  }
  Result<std::unique_ptr<CollectiveOp>> recv(void* buf, std::size_t count, adam::DType t, int peer) override {
    if (Result<bool> r = after_compute(); !r) return make_error(r.error());
    if (Result<bool> r = enqueued(ncclRecv(buf, count, nccl_type(t), peer, comm(), stream_), "ncclRecv"); !r)
      return make_error(r.error());
    return done_op();
  }
  Result<std::unique_ptr<CollectiveOp>> reduce(void* buf, std::size_t count, adam::DType t, int root) override {
    if (Result<bool> r = after_compute(); !r) return make_error(r.error());
    if (Result<bool> r = enqueued(ncclReduce(buf, buf, count, nccl_type(t), ncclSum, root, comm(), stream_), "ncclReduce"); !r)
      return make_error(r.error());
    return done_op();
  }

  Result<std::vector<std::uint64_t>> all_gather_u64(std::uint64_t v) override { return boot_.all_gather_u64(v); }
  Result<double> all_reduce_sum(double v) override { return boot_.all_reduce_sum(v); }
  Result<bool> all_reduce_sum_host(float* buf, std::size_t count) override {
    return boot_.all_reduce_sum_host(buf, count);
  }
  Result<bool> barrier() override { return boot_.barrier(); }

 private:
  // The collective reads what the compute stream wrote: its stream waits for the compute stream.
  Result<bool> after_compute() {
    MpiWorld::get().entered_collective();  // every collective starts here: the watchdog's board
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(e, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(stream_, e, 0));
    cudaEventDestroy(e);
    return true;
  }
  Result<std::unique_ptr<CollectiveOp>> done_op() {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(e, stream_));
    return std::unique_ptr<CollectiveOp>(new NcclOp(comm_, e));
  }
  ncclComm_t comm() const { return comm_->comm; }
  // A collective NCCL refused to enqueue: the communicator is aborted (a peer may have enqueued it)
  Result<bool> enqueued(ncclResult_t rc, const char* what) {
    if (rc == ncclSuccess) return true;
    comm_->abort();
    return make_error(std::string(what) + ": " + ncclGetErrorString(rc) + " (the communicator is aborted)");
  }
  Collectives& boot_;
  std::shared_ptr<Comm> comm_;
  cudaStream_t compute_, stream_;
  std::size_t free_before_ = 0;  // free device memory before ncclCommInitRank
};

}  // namespace

Result<std::unique_ptr<Collectives>> make_nccl_collectives(Backend& backend, Collectives& bootstrap) {
  if (!backend.ops().native_stream) return make_error("NCCL collectives need the cuda backend");
  Result<Stream> s = backend.ops().stream_create(backend.ctx());
  if (!s) return make_error(s.error());
  auto* compute = static_cast<cudaStream_t>(backend.ops().native_stream(backend.ctx(), 0));
  auto* comm_stream = static_cast<cudaStream_t>(backend.ops().native_stream(backend.ctx(), *s));
  // the unique id from rank 0, over MPI, 8 bytes at a time
  ncclUniqueId id;
  if (bootstrap.rank() == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  static_assert(sizeof(id) % 8 == 0);
  for (std::size_t at = 0; at < sizeof(id); at += 8) {
    std::uint64_t word = 0;
    std::memcpy(&word, reinterpret_cast<char*>(&id) + at, 8);
    Result<std::vector<std::uint64_t>> all = bootstrap.all_gather_u64(word);
    if (!all) return make_error(all.error());
    std::memcpy(reinterpret_cast<char*>(&id) + at, &(*all)[0], 8);
  }
  std::size_t free_before = 0, total = 0;
  if (cudaMemGetInfo(&free_before, &total) != cudaSuccess) free_before = 0;  // device_bytes() then says 0
  ncclComm_t comm;
  NCCL_CHECK(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()));
  return std::unique_ptr<Collectives>(new NcclCollectives(bootstrap, comm, compute, comm_stream, free_before));
}

}  // namespace memwall::exec
