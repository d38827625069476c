// Helpers the sim tests share.
#pragma once

#include "model/hardware_profile.hpp"

namespace memwall::sim::testing {

// The paper's DGX-2 profile scaled to `nodes` nodes.
inline HardwareProfile dgx2(int nodes = 1) { return *scale_to_nodes(*load_profile("dgx2"), nodes); }

}  // namespace memwall::sim::testing
