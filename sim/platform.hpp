// Platform: a SimGrid (S4U) platform built in code from a HardwareProfile: one host per GPU, a CPU
// host per node carrying the node's NVMe as an s4u::Disk, NVLink/NVSwitch, per-GPU PCIe links, the
// node's shared PCIe root, and the node's NIC into the inter-node fabric. Link capacities are the
// profile's, and SimGrid is configured so a transfer of B bytes on an idle link of bandwidth W takes
// exactly B/W + latency (no TCP corrections). Owns no schedule. One per simulation; SimGrid allows
// one engine per process, so build it on the thread that runs the simulation.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <simgrid/s4u.hpp>

#include "model/hardware_profile.hpp"

namespace memwall::sim {

namespace sg4 = simgrid::s4u;

struct Platform {
  int nodes = 0;            // nodes built (the others are represented by `fabric`)
  int gpus_per_node = 0;
  std::vector<sg4::Host*> gpu;   // gpu[node * gpus_per_node + i], speed = achievable peak (flop/s)
  std::vector<sg4::Host*> cpu;   // cpu[node], speed = CPU Adam throughput (params/s)
  std::vector<sg4::Disk*> nvme;  // nvme[node], on the CPU host, the node's aggregate read/write bandwidth
  sg4::Host* fabric = nullptr;   // the rest of the cluster, reached through each node's NIC (nullptr: one node)
  sg4::Host* peer = nullptr;     // any other GPU of the node, reached over NVSwitch (symmetric replay)

  sg4::Host* gpu_at(int node, int i) const { return gpu[node * gpus_per_node + i]; }
};

// Per-link latency: small compared with any transfer the schedule makes, but not zero, so that the
// B/W + latency law is visible in tests.
constexpr double kLinkLatency_s = 1e-6;

// Builds the platform for `nodes_built` nodes of `profile`; a fabric host stands for the other
// profile.nodes - nodes_built nodes when there are any. `peak_flops_per_s` is the GPU speed for
// this model's hidden size. `share` > 1 builds the view of one GPU out of `share` identical ones
// running the same steps at the same time: the node's shared resources (PCIe root, NVMe, CPU, NIC)
// get 1/share of their capacity, which is exact by symmetry and lets one rank stand for all.
Platform build_platform(sg4::Engine& engine, const HardwareProfile& profile, int nodes_built,
                        double peak_flops_per_s, int share = 1);

// The SimGrid settings that make links behave as B/W + latency. Call before build_platform.
void configure_engine(sg4::Engine& engine);

}  // namespace memwall::sim
