// MPI collectives (OpenMPI): non-blocking MPI_I* calls polled with MPI_Test by the engine's
// dispatcher. Every MPI call goes through MPI_CHECK, which turns a failure into an error naming the
// call, file:line and MPI's own message.
#include <mpi.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>

#include "exec/backend/half.hpp"
#include "exec/engine/collectives.hpp"
#include "exec/adam/cpu_adam.hpp"
#include "model/units.hpp"

namespace memwall::exec {
namespace {

std::string mpi_error(const char* call, int rc, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(file) + ":" + std::to_string(line) + ": " + call + ": " + std::string(text, std::size_t(len));
}
#define MPI_CHECK(call)                                                         \
  do {                                                                          \
    int mpi_rc_ = (call);                                                       \
    if (mpi_rc_ != MPI_SUCCESS) return make_error(mpi_error(#call, mpi_rc_, __FILE__, __LINE__)); \
  } while (0)

// 16-bit sums: each pair is added in fp32 and rounded once, as the engine's accumulate_to does.
template <adam::DType T>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    b[i] = half::half_from_f32(half::add_f32(half::f32_from_half(a[i], T), half::f32_from_half(b[i], T)), T);
}

struct Types {
  MPI_Op bf16_sum = MPI_OP_NULL, fp16_sum = MPI_OP_NULL;
};

MPI_Datatype mpi_type(adam::DType t) { return t == adam::DType::fp32 ? MPI_FLOAT : MPI_UINT16_T; }

class MpiOp : public CollectiveOp {
 public:
  MpiOp() = default;
  ~MpiOp() override {
    if (abandoned_) return;  // the job is being aborted: waiting would wait for the rank that stopped
    if (req_ != MPI_REQUEST_NULL) {  // never leave MPI writing into freed memory
      MPI_Wait(&req_, MPI_STATUS_IGNORE);
    }
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }
  void abandon() override { abandoned_ = true; }
  MPI_Request* request() { return &req_; }
  void own_type(MPI_Datatype t) { type_ = t; }
  // after completion: copy `bytes` from `from` to `to` (an in-place reduce-scatter's result)
  void then_copy(const void* from, void* to, std::size_t bytes) {
    from_ = from;
    to_ = to;
    bytes_ = bytes;
  }
  Result<bool> test() override {
    if (req_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    MPI_CHECK(MPI_Test(&req_, &done, MPI_STATUS_IGNORE));
    if (done && bytes_ > 0 && from_ != to_) std::memmove(to_, from_, bytes_);
    return done != 0;
  }

 private:
  MPI_Request req_ = MPI_REQUEST_NULL;
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
  bool abandoned_ = false;
  const void* from_ = nullptr;
  void* to_ = nullptr;
  std::size_t bytes_ = 0;
};

class MpiCollectives : public Collectives {
 public:
  MpiCollectives(double stall_timeout_s, MPI_Comm comm) : comm_(comm), stall_timeout_s_(stall_timeout_s) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    members_ = "over every rank of the job";
    if (comm_ != MPI_COMM_WORLD) {  // the group's members by their world ranks, for messages
      MPI_Group mine = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
      MPI_Comm_group(comm_, &mine);
      MPI_Comm_group(MPI_COMM_WORLD, &world);
      std::vector<int> in(std::size_t(size_), 0), out(std::size_t(size_), 0);
      for (int i = 0; i < size_; ++i) in[std::size_t(i)] = i;
      MPI_Group_translate_ranks(mine, size_, in.data(), world, out.data());
      MPI_Group_free(&mine);
      MPI_Group_free(&world);
      members_ = "over world ranks ";
      for (int i = 0; i < size_; ++i) members_ += (i ? ", " : "") + std::to_string(out[std::size_t(i)]);
    }
    MPI_Op_create(&sum16<adam::DType::bf16>, 1, &types_.bf16_sum);
    MPI_Op_create(&sum16<adam::DType::fp16>, 1, &types_.fp16_sum);
  }
  ~MpiCollectives() override {
    MPI_Op_free(&types_.bf16_sum);
    MPI_Op_free(&types_.fp16_sum);
    if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  Result<std::unique_ptr<CollectiveOp>> all_gather(void* base, std::size_t count, std::size_t stride,
                                                   adam::DType t, const void* send) override {
    auto op = std::make_unique<MpiOp>();
    MpiWorld::get().entered_collective();
    // rank q's block is `count` elements at q * stride: one contiguous block type whose extent is
    // the stride, gathered in place
    MPI_Datatype block = MPI_DATATYPE_NULL, strided = MPI_DATATYPE_NULL;
    MPI_CHECK(MPI_Type_contiguous(int(count), mpi_type(t), &block));
    MPI_CHECK(MPI_Type_create_resized(block, 0, MPI_Aint(stride * adam::dtype_bytes(t)), &strided));
    MPI_Type_free(&block);
    MPI_CHECK(MPI_Type_commit(&strided));
    op->own_type(strided);
    if (send)
      MPI_CHECK(MPI_Iallgather(send, int(count), mpi_type(t), base, 1, strided, comm_, op->request()));
    else
      MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, base, 1, strided, comm_, op->request()));
    return std::unique_ptr<CollectiveOp>(std::move(op));
  }

  Result<std::unique_ptr<CollectiveOp>> reduce_scatter(void* buf, void* out, std::size_t count,
                                                       adam::DType t) override {
    auto op = std::make_unique<MpiOp>();
    MpiWorld::get().entered_collective();
    // in place: the sum of this rank's slice lands at the start of buf, then moves to `out`
    MPI_CHECK(MPI_Ireduce_scatter_block(MPI_IN_PLACE, buf, int(count), mpi_type(t), sum(t), comm_,
                                        op->request()));
    op->then_copy(buf, out, count * adam::dtype_bytes(t));
    return std::unique_ptr<CollectiveOp>(std::move(op));
  }

  Result<std::unique_ptr<CollectiveOp>> all_reduce(void* buf, std::size_t count, adam::DType t) override {
    auto op = std::make_unique<MpiOp>();
    MpiWorld::get().entered_collective();
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, int(count), mpi_type(t), sum(t), comm_, op->request()));
    return std::unique_ptr<CollectiveOp>(std::move(op));
  }

  Result<std::unique_ptr<CollectiveOp>> broadcast(void* buf, std::size_t count, adam::DType t, int root) override {
    auto op = std::make_unique<MpiOp>();
    MpiWorld::get().entered_collective();
    MPI_CHECK(MPI_Ibcast(buf, int(count), mpi_type(t), root, comm_, op->request()));
    return std::unique_ptr<CollectiveOp>(std::move(op));
  }

  Result<std::unique_ptr<CollectiveOp>> reduce(void* buf, std::size_t count, adam::DType t, int root) override {
    auto op = std::make_unique<MpiOp>();
    MpiWorld::get().entered_collective();
    MPI_CHECK(MPI_Ireduce(rank_ == root ? MPI_IN_PLACE : buf, rank_ == root ? buf : nullptr, int(count), mpi_type(t),
                          sum(t), root, comm_, op->request()));
    return std::unique_ptr<CollectiveOp>(std::move(op));
  }

  Result<std::unique_ptr<CollectiveOp>> send(const void* buf, std::size_t count, adam::DType t, int peer) override {
    auto op = std::make_unique<MpiOp>();
    MpiWorld::get().entered_collective();
    MPI_CHECK(MPI_Isend(buf, int(count), mpi_type(t), peer, 0, comm_, op->request()));
    return std::unique_ptr<CollectiveOp>(std::move(op));
  }
  Result<std::unique_ptr<CollectiveOp>> recv(void* buf, std::size_t count, adam::DType t, int peer) override {
    auto op = std::make_unique<MpiOp>();
    MpiWorld::get().entered_collective();
    MPI_CHECK(MPI_Irecv(buf, int(count), mpi_type(t), peer, 0, comm_, op->request()));
    return std::unique_ptr<CollectiveOp>(std::move(op));
  }

  Result<std::vector<std::uint64_t>> all_gather_u64(std::uint64_t v) override {
    std::vector<std::uint64_t> all(static_cast<std::size_t>(size_));
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Iallgather(&v, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, comm_, &req));
    if (Result<bool> ok = wait(req, "an all-gather of one number per rank"); !ok) return make_error(ok.error());
    return all;
  }
  Result<double> all_reduce_sum(double v) override {
    double s = 0;
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Iallreduce(&v, &s, 1, MPI_DOUBLE, MPI_SUM, comm_, &req));
    if (Result<bool> ok = wait(req, "an all-reduce of one number per rank (the loss, or a check)"); !ok)
      return make_error(ok.error());
    return s;
  }
  Result<bool> all_reduce_sum_host(float* buf, std::size_t count) override {
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, int(count), MPI_FLOAT, MPI_SUM, comm_, &req));
    return wait(req, "an all-reduce of " + std::to_string(count) + " fp32 in host memory");
  }
  Result<bool> barrier() override {
    MPI_Request req = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Ibarrier(comm_, &req));
    return wait(req, "a barrier");
  }

 private:
  // MPI_Test until done, as the engine's watchdog waits: with nothing moving on any rank of the
  // node for the stall limit, an error naming the rank waited for. The request is then left to MPI
  // (the caller is on its way to MPI_Abort; freeing its buffers could let MPI write into them).
  Result<bool> wait(MPI_Request& req, const std::string& what) {
    MpiWorld::get().entered_collective();
    PeerWatch watch;
    watch.moved();
    using Clock = std::chrono::steady_clock;
    auto last_change = Clock::now();
    int backoff_us = 1;
    for (;;) {
      int done = 0;
      MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
      if (done) return true;
      const auto now = Clock::now();
      if (watch.moved()) last_change = now;
      const double still = std::chrono::duration<double>(now - last_change).count();
      if (still > stall_timeout_s_)
        return make_error("stuck in " + what + " " + members_ + ": no rank of this node moved for " + format_sig(still, 3) +
                          " s (limit " + format_sig(stall_timeout_s_, 3) + " s); " + watch.waiting_for());
      std::this_thread::sleep_for(std::chrono::microseconds(backoff_us));
      backoff_us = std::min(1000, backoff_us * 2);
    }
  }

  MPI_Op sum(adam::DType t) const {
    return t == adam::DType::fp32 ? MPI_SUM : t == adam::DType::bf16 ? types_.bf16_sum : types_.fp16_sum;
  }
  MPI_Comm comm_ = MPI_COMM_WORLD;
  int rank_ = 0, size_ = 1;
  std::string members_;  // "over world ranks 0, 2": the group's members
  double stall_timeout_s_ = 120;
  Types types_;
};

}  // namespace

bool launched_by_mpirun() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

MpiWorld::MpiWorld() {
  if (!launched_by_mpirun()) return;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  // errors come back as codes (MPI_CHECK), not as MPI's default abort
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  active_ = true;
  // The progress board: one counter per rank of this node in memory they all map (an MPI-3
  // shared-memory window); without one (an MPI that cannot) the watchdog sees this rank only.
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node) != MPI_SUCCESS) return;
  node_comm_ = node;
  int node_size = 1;
  MPI_Comm_size(node, &node_size);
  int node_rank = 0;
  MPI_Comm_rank(node, &node_rank);
  node_rank_ = node_rank;
  {
    const int mine[2] = {rank_, int(getpid())};
    std::vector<int> all(2 * std::size_t(node_size), 0);
    if (MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, node) == MPI_SUCCESS)
      for (int q = 0; q < node_size; ++q)
        if (q != node_rank) {
          node_peers_.push_back({all[2 * std::size_t(q)], all[2 * std::size_t(q) + 1]});
          node_peer_pids_.push_back(all[2 * std::size_t(q) + 1]);
        }
  }
  void* mine = nullptr;
  MPI_Win win = MPI_WIN_NULL;
  const MPI_Aint entry = 2 * sizeof(std::uint64_t);  // completions, collectives entered
  if (MPI_Win_allocate_shared(entry, 1, MPI_INFO_NULL, node, &mine, &win) != MPI_SUCCESS) {
    node_peers_.clear();
    return;
  }
  board_win_ = win;
  board_mine_ = static_cast<std::uint64_t*>(mine);
  board_mine_[0] = board_mine_[1] = 0;
  for (int q = 0; q < node_size; ++q) {
    MPI_Aint bytes = 0;
    int unit = 0;
    void* at = nullptr;
    if (q == node_rank) continue;
    if (MPI_Win_shared_query(win, q, &bytes, &unit, &at) != MPI_SUCCESS || at == nullptr) {
      board_peers_.clear();  // all or none: board_peers_[i] is node_peers_[i]'s
      node_peers_.clear();
      break;
    }
    board_peers_.push_back(static_cast<std::uint64_t*>(at));
  }
  MPI_Barrier(node);  // every counter is zero before anyone reads one
}

MpiWorld::~MpiWorld() {
  if (!active_) return;
  if (board_win_) {
    MPI_Win w = static_cast<MPI_Win>(board_win_);
    MPI_Win_free(&w);
  }
  if (node_comm_) {
    MPI_Comm c = static_cast<MPI_Comm>(node_comm_);
    MPI_Comm_free(&c);
  }
  MPI_Finalize();
}

void MpiWorld::publish_progress(std::uint64_t n) {
  if (board_mine_) std::atomic_ref<std::uint64_t>(board_mine_[0]).store(n, std::memory_order_relaxed);
}

void MpiWorld::entered_collective() {
  ++collectives_;
  if (board_mine_) std::atomic_ref<std::uint64_t>(board_mine_[1]).store(collectives_, std::memory_order_relaxed);
}

std::uint64_t MpiWorld::collectives_entered() const { return collectives_; }

std::uint64_t MpiWorld::peer_progress() const {
  std::uint64_t sum = 0;
  for (std::uint64_t* p : board_peers_) sum += std::atomic_ref<std::uint64_t>(p[0]).load(std::memory_order_relaxed);
  return sum;
}

std::vector<MpiWorld::PeerState> MpiWorld::peer_states() const {
  std::vector<PeerState> out;
  for (std::size_t i = 0; i < board_peers_.size() && i < node_peers_.size(); ++i)
    out.push_back({node_peers_[i].rank, node_peers_[i].pid,
                   std::atomic_ref<std::uint64_t>(board_peers_[i][0]).load(std::memory_order_relaxed),
                   std::atomic_ref<std::uint64_t>(board_peers_[i][1]).load(std::memory_order_relaxed)});
  return out;
}

bool PeerWatch::moved() {
  const double now =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  const std::vector<MpiWorld::PeerState> states = MpiWorld::get().peer_states();
  bool any = seen_.size() != states.size();
  if (any) seen_.assign(states.size(), Seen{});
  std::uint64_t sig = 0;
  for (std::size_t i = 0; i < states.size(); ++i) {
    const MpiWorld::PeerState& s = states[i];
    sig += s.completions + s.collectives;
    if (seen_[i].changed_s == 0 || s.completions != seen_[i].state.completions ||
        s.collectives != seen_[i].state.collectives) {
      any = any || seen_[i].changed_s != 0;
      seen_[i].state = s;
      seen_[i].changed_s = now;
    }
  }
  signature_ = sig;
  return any;
}

namespace {

// A local process's state as the kernel shows it (/proc/PID/stat, the field after the name):
// "running", "stopped (SIGSTOP, or a debugger)", "a zombie", "gone", ...
std::string process_state(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!f || !std::getline(f, text)) return "gone";
  const std::size_t close = text.rfind(')');
  const char state = close != std::string::npos && close + 2 < text.size() ? text[close + 2] : '?';
  switch (state) {
    case 'R': return "running";
    case 'S': return "sleeping";
    case 'D': return "in uninterruptible I/O";
    case 'T': return "stopped (SIGSTOP, or a debugger)";
    case 't': return "stopped by a debugger";
    case 'Z': return "a zombie (it exited)";
    case 'X': return "gone";
    default: return std::string("in state ") + state;
  }
}

}  // namespace

std::string PeerWatch::waiting_for() const {
  if (seen_.empty())
    return "no other rank of this job on this node to watch: the rank waited for is on another node, or stopped "
           "before it could say";
  const double now =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  const std::uint64_t mine = MpiWorld::get().collectives_entered();
  std::string culprits, rest;
  for (const Seen& s : seen_) {
    const std::string state = process_state(s.state.pid);
    const bool behind = s.state.collectives < mine;
    const bool halted = state != "running" && state != "sleeping" && state != "in uninterruptible I/O";
    std::string& into = behind || halted ? culprits : rest;
    into += std::string(into.empty() ? "" : "; ") + "rank " + std::to_string(s.state.rank) + " (pid " +
            std::to_string(s.state.pid) + "), " + state + ", which has entered " + std::to_string(s.state.collectives) +
            " collectives to this rank's " + std::to_string(mine) + " and completed nothing for " +
            format_sig(now - s.changed_s, 3) + " s";
  }
  if (!culprits.empty()) return "waiting for " + culprits + (rest.empty() ? "" : "; the others: " + rest);
  return "every rank of this node has reached this collective and is alive (" + rest +
         "): the rank waited for is on another node, or the collective itself is stuck";
}

MpiWorld& MpiWorld::get() {
  static MpiWorld world;
  return world;
}

void MpiWorld::abort(const std::string& message, int code) {
  std::cerr << message << std::endl;
  if (active_) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

Result<std::unique_ptr<Collectives>> make_mpi_collectives(double stall_timeout_s, int color, int key) {
  if (!MpiWorld::get().active()) return make_error("MPI collectives need a job started by mpirun");
  if (color < 0) return std::unique_ptr<Collectives>(new MpiCollectives(stall_timeout_s, MPI_COMM_WORLD));
  MPI_Comm group = MPI_COMM_NULL;
  if (int rc = MPI_Comm_split(MPI_COMM_WORLD, color, key, &group); rc != MPI_SUCCESS || group == MPI_COMM_NULL)
    return make_error("MPI_Comm_split (color " + std::to_string(color) + ", key " + std::to_string(key) +
                      ") failed with code " + std::to_string(rc));
  MPI_Comm_set_errhandler(group, MPI_ERRORS_RETURN);
  return std::unique_ptr<Collectives>(new MpiCollectives(stall_timeout_s, group));
}

#if !MEMWALL_HAVE_NCCL
Result<std::unique_ptr<Collectives>> make_nccl_collectives(Backend&, Collectives&) {
  return make_error("this memwall was built without NCCL (no CUDA toolkit with NCCL at configure time)");
}
#endif

}  // namespace memwall::exec
