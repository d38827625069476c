// Platform: a SimGrid (S4U) platform built in code from a HardwareProfile: one host per GPU, the
// node's CPU memory (DRAM), NVMe, CPU cores (for CPU Adam), PCIe links and PCIe root, NVLink to
// NVSwitch and the node's NICs, all as links, so every transfer is one flow over the resources it
// really crosses and contention comes from SimGrid's max-min sharing. SimGrid is configured so a
// transfer of B bytes on an idle route of bandwidth W takes exactly B/W, flows sharing a link fairly.
// Two shapes: the whole machine (every GPU of every node used), or the view of one GPU out of
// `share` identical ones (the node's shared resources get 1/share of their capacity, and stand-in
// hosts play the other GPUs of the node and the other nodes). Owns no schedule. One per simulation;
// SimGrid allows one engine per process, so build it on the thread that runs the simulation.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <simgrid/s4u.hpp>

#include "model/hardware_profile.hpp"

namespace memwall::sim {

namespace sg4 = simgrid::s4u;

// Latency per link a collective's step crosses: model/hardware_profile.hpp's. Links themselves
// carry none (see build_platform): an idle route moves B bytes in exactly B/W, and collectives add
// their steps' latencies as delays of their own.
using memwall::kLinkLatency_s;

struct PlatformShape {
  int nodes = 1;          // nodes built
  int gpus_per_node = 1;  // GPUs built in each node
  int share = 1;          // > 1: the node's shared resources get 1/share of their capacity
  bool stand_ins = false; // build `peer` (the node's other GPUs) and `fabric` (the other nodes)
};

struct Platform {
  int nodes = 0;
  int gpus_per_node = 0;
  std::vector<sg4::Host*> gpu;   // gpu[node * gpus_per_node + i], speed = achievable peak (flop/s)
  std::vector<sg4::Host*> dram;  // dram[node]: the node's CPU memory, where every host transfer ends
  std::vector<sg4::Host*> nvme;  // nvme[node]: the node's NVMe (a flow from it is a read)
  std::vector<sg4::Host*> adam;  // adam[node]: CPU Adam is a flow dram -> adam over the CPU cores and DRAM
  // cores[node] (gpu.shared_peak only): the one compute resource all the node's GPUs run on, speed =
  // the node's shared rate; executions on it at once share it fairly, each bounded by the peak of a
  // GPU alone (the cpu backend's devices are the host's cores and memory)
  std::vector<sg4::Host*> cores;
  sg4::Host* peer = nullptr;     // stand-in: the node's other GPUs, over NVSwitch
  sg4::Host* fabric = nullptr;   // stand-in: the other nodes, through this node's NICs
  sg4::Host* clock = nullptr;    // delays and joins: as many cores as needed, never a bottleneck
  double clock_speed = 1e9;      // an exec of d * clock_speed flops on `clock` lasts d seconds

  sg4::Host* gpu_at(int node, int i) const { return gpu[size_t(node * gpus_per_node + i)]; }
  // The links a flow from `a` to `b` crosses (split-duplex links as their one direction); cached.
  const std::vector<sg4::Link*>& route(sg4::Host* a, sg4::Host* b) const;

 private:
  mutable std::map<std::pair<sg4::Host*, sg4::Host*>, std::vector<sg4::Link*>> routes_;
};

// The resource class a link belongs to in reports: "pcie", "pcie_root", "nvlink", "network",
// "dram", "nvme", "cpu".
std::string link_class(const sg4::Link& link);

Platform build_platform(sg4::Engine& engine, const HardwareProfile& profile, const PlatformShape& shape,
                        double peak_flops_per_s);

// The SimGrid settings that make links behave as B/W + latency. Call before build_platform.
void configure_engine(sg4::Engine& engine);

}  // namespace memwall::sim
