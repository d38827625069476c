// init_tool OUT STRATEGY [CAPACITY_MIB]: creates the engine for an 8-layer, 512-hidden GPT on this
// job's ranks (run it under mpirun), checks that no rank held the whole model on its device while
// it initialised its shard, and writes the assembled fp32 master parameters (rank 0) to OUT. The
// files of dp 1, 2 and 4 must be identical bit for bit (partitioned initialisation, Sec. 7.2).
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "exec/engine/engine.hpp"

using namespace memwall;
using namespace memwall::exec;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::cerr << "usage: init_tool OUT STRATEGY [CAPACITY_MIB]\n";
    return 2;
  }
  EngineOptions o;
  o.model = GptConfig{8, 512, 8, 64, 256};
  o.config.bsz = 1;
  o.placement = load_placement(argv[2]).value();
  o.profile = load_profile("local-cpu").value();
  if (argc > 3) o.capacity_bytes = std::size_t(std::atol(argv[3])) << 20;
  o.nvme_dir = std::string(argv[1]) + ".swap";
  std::filesystem::create_directories(o.nvme_dir);
  auto e = Engine::create(o);
  if (!e) {
    std::cerr << "init_tool: " << e.error() << "\n";
    return 1;
  }
  const EngineStats st = (*e)->stats();
  // the 16-bit parameters and gradients and 12 B of Adam state per parameter of the whole model
  const double whole_states = double((*e)->num_params()) * 16;
  std::cout << "rank " << (*e)->rank() << " of " << (*e)->ranks() << ": device high-water "
            << st.device_high_water_bytes << " of " << st.device_capacity_bytes << " bytes; the whole model's states "
            << std::size_t(whole_states) << " bytes" << std::endl;
  if (st.device_high_water_bytes > st.device_capacity_bytes) return 1;
  Result<std::vector<float>> p = (*e)->master_params();
  if (!p) {
    std::cerr << "init_tool: " << p.error() << "\n";
    return 1;
  }
  if ((*e)->rank() == 0) {
    std::ofstream out(argv[1], std::ios::binary);
    out.write(reinterpret_cast<const char*>(p->data()), std::streamsize(p->size() * sizeof(float)));
  }
  std::filesystem::remove_all(o.nvme_dir);
  return 0;
}
