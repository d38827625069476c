// Collectives between the ranks of one group of a run (its data-parallel or tensor-slicing ranks): what the schedule's gg and bcast fetches,
// reduce_scatter (rs, and the owner's reduce) and allreduce steps do. Two implementations behind one
// small interface: MPI (OpenMPI) between processes, for the cpu backend, and NCCL between GPUs, for
// cuda (its unique id bootstrapped over MPI). No home-made transport.
//
// Contract (as c10d's): every rank makes the same calls in the same order; the engine issues the
// schedule's collective steps strictly in schedule order. Calls return at once with an operation the
// caller polls; its buffers stay the caller's and must live until it is done. Element types are the
// engine's: fp32, bf16, fp16 (16-bit sums are formed in fp32 and rounded once per reduction step).
// Thread-safety: one thread (the engine's dispatcher) calls and polls; MPI runs FUNNELED.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "exec/adam/adam_types.hpp"
#include "exec/backend/backend.hpp"
#include "model/result.hpp"

namespace memwall::exec {

class CollectiveOp {
 public:
  virtual ~CollectiveOp() = default;
  // true when done (and whatever it leaves behind is in place); an error stops the run
  virtual Result<bool> test() = 0;
  // The job is being stopped because a rank stopped answering: the destructor must not wait for
  // this operation (it would wait for that rank forever). Only on the way to MpiWorld::abort: the
  // operation's buffers may be written until the process ends.
  virtual void abandon() {}
};

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "mpi", "nccl"
  // Device memory the library took for this communicator so far (nccl: free device memory before
  // ncclCommInitRank less free memory now, so call it with nothing else allocated in between); 0
  // for host-side collectives.
  virtual std::size_t device_bytes() const { return 0; }

  // Rank q's `count` elements go to base + q * stride (elements); afterwards every rank has every
  // rank's. This rank's come from `send` (nullptr: they are in place already). stride == count is
  // the plain all-gather of a contiguous buffer.
  virtual Result<std::unique_ptr<CollectiveOp>> all_gather(void* base, std::size_t count, std::size_t stride,
                                                           adam::DType t, const void* send = nullptr) = 0;
  // `buf` holds size() x count elements; their sum over ranks is formed and this rank's slice
  // (elements [rank * count, (rank + 1) * count)) lands in `out` (count elements; may be that
  // slice of buf itself). `buf` is scratch afterwards.
  virtual Result<std::unique_ptr<CollectiveOp>> reduce_scatter(void* buf, void* out, std::size_t count,
                                                               adam::DType t) = 0;
  virtual Result<std::unique_ptr<CollectiveOp>> all_reduce(void* buf, std::size_t count, adam::DType t) = 0;
  virtual Result<std::unique_ptr<CollectiveOp>> broadcast(void* buf, std::size_t count, adam::DType t, int root) = 0;
  // the sum over ranks lands in root's buf (other ranks' buf is scratch afterwards)
  virtual Result<std::unique_ptr<CollectiveOp>> reduce(void* buf, std::size_t count, adam::DType t, int root) = 0;
  // Point to point (a pipeline stage's activations or their gradients): `count` elements to or from
  // group rank `peer`; the two ranks' calls pair in the order each makes them.
  virtual Result<std::unique_ptr<CollectiveOp>> send(const void* buf, std::size_t count, adam::DType t, int peer) = 0;
  virtual Result<std::unique_ptr<CollectiveOp>> recv(void* buf, std::size_t count, adam::DType t, int peer) = 0;

  // Host-side and blocking, for setup and checks outside the schedule. MPI's wait as the engine's
  // watchdog does: with no rank of the node moving for the stall limit, an error naming the rank
  // waited for (PeerWatch).
  virtual Result<std::vector<std::uint64_t>> all_gather_u64(std::uint64_t v) = 0;
  virtual Result<double> all_reduce_sum(double v) = 0;
  virtual Result<bool> all_reduce_sum_host(float* buf, std::size_t count) = 0;  // host memory, in place
  virtual Result<bool> barrier() = 0;
};

// The process's MPI world, initialised once (MPI_THREAD_FUNNELED) and finalised at exit. `size()`
// 1 and no MPI at all when the process was not started by mpirun (so a plain `memwall run` needs
// no MPI runtime). Not copyable; one per process.
class MpiWorld {
 public:
  static MpiWorld& get();            // initialises MPI on first use when launched by mpirun
  bool active() const { return active_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // This rank's index among the ranks of its node (MPI_Comm_split_type, shared memory): the
  // device it drives. 0 outside mpirun or where the split failed.
  int node_rank() const { return node_rank_; }
  // Stops every rank of the job (MPI_Abort) after printing `message` on this rank's stderr.
  [[noreturn]] void abort(const std::string& message, int code);
  // The progress board of the ranks of this node: each publishes how many steps it has completed
  // so far and how many collectives it has entered, and sees the others' (the engine's watchdog: a
  // rank waiting in a collective for a slow peer is not stuck while the peer moves, and one that is
  // names the peer that has not reached the collective). Lock-free, any thread.
  void publish_progress(std::uint64_t completed);
  std::uint64_t peer_progress() const;  // the others' completions, summed
  void entered_collective();  // every collective call, engine steps and host ones alike
  std::uint64_t collectives_entered() const;
  struct PeerState {
    int rank = 0, pid = 0;  // world rank, process id
    std::uint64_t completions = 0, collectives = 0;
  };
  std::vector<PeerState> peer_states() const;
  // The process ids of this node's other ranks (their CPU time is the job's, not another
  // program's: host_cores), gathered when MPI starts; empty without mpirun.
  const std::vector<int>& node_peer_pids() const { return node_peer_pids_; }
  ~MpiWorld();

 private:
  MpiWorld();
  bool active_ = false;
  int rank_ = 0, size_ = 1, node_rank_ = 0;
  void* node_comm_ = nullptr;  // MPI_Comm of this node's ranks (an opaque handle here)
  void* board_win_ = nullptr;  // MPI_Win of the board
  std::uint64_t* board_mine_ = nullptr;      // [completions, collectives entered]
  std::vector<std::uint64_t*> board_peers_;  // the same pair per peer, in node_peers_ order
  struct NodePeer {
    int rank = 0, pid = 0;
  };
  std::vector<NodePeer> node_peers_;
  std::vector<int> node_peer_pids_;
  std::uint64_t collectives_ = 0;  // without a board
};

// What the node's other ranks did while this one waits: moved() refreshes from the board (true
// when any counter changed); waiting_for() names the ranks this one waits for, with what they did
// last: those that have not entered this rank's latest collective first, else those that stopped
// moving longest ago. Empty board (one rank, or an MPI without shared windows): says so.
class PeerWatch {
 public:
  bool moved();
  std::uint64_t signature() const { return signature_; }
  std::string waiting_for() const;

 private:
  struct Seen {
    MpiWorld::PeerState state;
    double changed_s = 0;  // steady clock, when its counters last changed
  };
  std::vector<Seen> seen_;
  std::uint64_t signature_ = 0;
};

// True when this process was started by mpirun (OpenMPI's or a PMI launcher's environment).
bool launched_by_mpirun();

// MPI collectives over the world (MPI_Iallgather, MPI_Ireduce_scatter_block, ... polled with
// MPI_Test; 16-bit sums through a user-defined MPI_Op). Needs MpiWorld::get().active().
// stall_timeout_s: how long a host-side collective waits with no rank of the node moving before
// it fails naming the rank it waits for (the engine passes its --stall-timeout). color < 0: over the
// world; else over the ranks of the same color (MPI_Comm_split, ordered by key): one group of the
// job's dp x mp layout. Every rank of the world must make the same calls (MPI_Comm_split is
// collective).
Result<std::unique_ptr<Collectives>> make_mpi_collectives(double stall_timeout_s = 120, int color = -1, int key = 0);

// NCCL collectives between the GPUs of the world on `backend`'s stream for them, the unique id
// broadcast over MPI. Only in builds with the cuda backend and NCCL.
Result<std::unique_ptr<Collectives>> make_nccl_collectives(Backend& backend, Collectives& bootstrap);

}  // namespace memwall::exec
