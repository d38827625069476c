// board_tool: the engine watchdog's progress board across ranks (MpiWorld::publish_progress /
// peer_progress, an MPI-3 shared-memory window over the node's ranks), run under mpirun -np 2.
// Rank 1 publishes 1, 2, ... 50, a millisecond apart; rank 0, which publishes nothing, must see
// the sum of the others' counts rise to 50 (a rank waiting in a collective for a moving peer is
// not stuck), and rank 1 must see 0 from rank 0. Exit 0 when both hold.
#include <chrono>
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
  Result<std::unique_ptr<Collectives>> c = make_mpi_collectives();
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
    return quiet ? 0 : 1;
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
  return seen == 50 ? 0 : 1;
}
