// board_tool: the engine watchdog's progress board across ranks (MpiWorld::publish_progress /
// peer_progress, an MPI-3 shared-memory window over the node's ranks), run under mpirun -np 2.
// Rank 1 publishes 1, 2, ... 50, a millisecond apart; rank 0, which publishes nothing, must see
// the sum of the others' counts rise to 50 (a rank waiting in a collective for a moving peer is
// not stuck), and rank 1 must see 0 from rank 0. Then rank 1 stops itself (SIGSTOP) before a
// barrier: rank 0's barrier, with a 2 s stall limit, must fail within seconds naming rank 1, its
// pid and "stopped" (a host-side collective waits as the engine's watchdog does); rank 0 then lets
// it go on (SIGCONT) and both meet at the next barrier. First, each rank's node rank (the device it
// drives) must be OpenMPI's own local rank. Exit 0 when all of it holds.
#include <signal.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "exec/engine/collectives.hpp"

using namespace memwall;
using namespace memwall::exec;

int main() {
  MpiWorld& w = MpiWorld::get();
  if (w.size() != 2) {
    std::cerr << "board_tool: run under mpirun -np 2\n";
    return 2;
  }
  // the device per rank: the node's own numbering of its ranks, which OpenMPI also exports
  if (const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK"); !local || std::atoi(local) != w.node_rank()) {
    std::cerr << "rank " << w.rank() << ": node rank " << w.node_rank() << ", OMPI_COMM_WORLD_LOCAL_RANK "
              << (local ? local : "unset") << "\n";
    return 1;
  }
  Result<std::unique_ptr<Collectives>> c = make_mpi_collectives(2.0);
  if (!c) {
    std::cerr << c.error() << "\n";
    return 1;
  }
  if (w.rank() == 1) {
    for (std::uint64_t n = 1; n <= 50; ++n) {
      w.publish_progress(n);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const bool quiet = w.peer_progress() == 0;
    (void)(*c)->barrier();
    if (!quiet) std::cerr << "rank 1 sees progress from rank 0, which published none\n";
    raise(SIGSTOP);  // rank 0 lets it go on once its barrier has given up
    Result<bool> met = (*c)->barrier();
    Result<bool> again = (*c)->barrier();
    if (!met || !again) std::cerr << "rank 1: " << (!met ? met.error() : again.error()) << "\n";
    return quiet && met && again ? 0 : 1;
  }
  std::uint64_t seen = 0, changes = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (seen < 50 && std::chrono::steady_clock::now() < until) {
    const std::uint64_t now = w.peer_progress();
    if (now != seen) ++changes;
    if (now < seen) {
      std::cerr << "rank 0 saw the peer's count go back from " << seen << " to " << now << "\n";
      return 1;
    }
    seen = now;
  }
  (void)(*c)->barrier();
  std::cout << "rank 0 saw rank 1's completions reach " << seen << " (" << changes << " changes seen)\n";
  const auto t0 = std::chrono::steady_clock::now();
  Result<bool> stopped = (*c)->barrier();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::vector<MpiWorld::PeerState> peers = w.peer_states();
  const int pid = peers.empty() ? 0 : peers[0].pid;
  if (pid > 0) kill(pid, SIGCONT);
  const std::string want = "waiting for rank 1 (pid " + std::to_string(pid) + "), stopped (SIGSTOP";
  bool named = !stopped && stopped.error().find("stuck in a barrier over every rank of the job: no rank of this node moved for") == 0 &&
               stopped.error().find(want) != std::string::npos;
  std::cout << "rank 0's barrier with rank 1 stopped: " << (stopped ? "returned" : stopped.error()) << " after " << took
            << " s\n";
  if (!named) std::cerr << "rank 0: expected an error naming \"" << want << "\"\n";
  Result<bool> met = (*c)->barrier();
  if (!met) std::cerr << "rank 0: " << met.error() << "\n";
  return seen == 50 && named && took < 20 && met ? 0 : 1;
}
