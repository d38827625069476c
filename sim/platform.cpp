#include "sim/platform.hpp"

#include <string>

namespace memwall::sim {

void configure_engine(sg4::Engine& engine) {
  (void)engine;
  // SimGrid's default LV08 model multiplies latency by 13.01, bandwidth by 0.97 and adds reverse
  // cross-traffic: right for TCP over Ethernet, wrong for PCIe and NVLink. CM02 is plain max-min
  // sharing; set every correction to neutral so that an idle link gives B/W + latency exactly.
  sg4::Engine::set_config("network/model:CM02");
  sg4::Engine::set_config("network/latency-factor:1.0");
  sg4::Engine::set_config("network/bandwidth-factor:1.0");
  sg4::Engine::set_config("network/crosstraffic:0");
  sg4::Engine::set_config("network/TCP-gamma:0");  // no TCP window bound on the rate
  sg4::Engine::set_config("network/weight-S:0");   // no RTT-based weighting of flows
}

//   One node of a DGX-2 (16 GPUs; other profiles differ only in counts and capacities):
//
//            NVSwitch (router "nvswitch-N")
//        ┌──────┬───────┴──┬───────────┐      nvlink-N-i: one split-duplex link per GPU,
//      nvlink  nvlink    nvlink      nvlink   links.gpu_gpu each way (70 GB/s)
//        │      │          │           │
//      GPU0   GPU1   ...  GPU14      GPU15    hosts "gpu-N-i", speed = achievable peak
//        │      │          │           │
//      pcie   pcie       pcie        pcie     pcie-N-i: links.pcie_single_gpu (12 GB/s)
//        └──────┴────┬─────┴───────────┘
//               pcie-root-N                   links.pcie_aggregate, shared (48 GB/s = 3.0 x 16)
//                    │
//                 CPU host "cpu-N"  ── disk "nvme-N": nvme.read / nvme.write (25 GB/s)
//                    │                 speed = cpu.adam_throughput (params/s)
//                  nic-N                      links.inter_node, split duplex (800 Gbps = 100 GB/s)
//                    │
//              fabric host (the other nodes, by symmetry)
//
// GPU->GPU in a node: nvlink-N-i (up), nvlink-N-j (down). GPU->CPU: pcie-N-i, pcie-root-N.
// GPU->other node: nvlink-N-i (up), nic-N (up): a hierarchical collective enters and leaves the
// node through its NICs and is spread over NVSwitch.
Platform build_platform(sg4::Engine& engine, const HardwareProfile& p, int nodes_built, double peak, int share) {
  (void)engine;
  Platform pf;
  pf.nodes = nodes_built;
  pf.gpus_per_node = p.gpus_per_node;
  auto* zone = sg4::create_full_zone("cluster");
  const double nvlink_Bps = p.gpu_gpu_Bps > 0 ? p.gpu_gpu_Bps : p.pcie_single_gpu_Bps;
  std::vector<sg4::SplitDuplexLink*> nic;
  std::vector<std::vector<sg4::SplitDuplexLink*>> nvlink(nodes_built);
  std::vector<std::vector<sg4::Link*>> pcie(nodes_built);
  std::vector<sg4::Link*> root;
  for (int n = 0; n < nodes_built; ++n) {
    const std::string N = std::to_string(n);
    sg4::Host* cpu = zone->create_host("cpu-" + N, p.cpu_adam_params_per_s / share);
    pf.cpu.push_back(cpu);
    pf.nvme.push_back(cpu->create_disk("nvme-" + N, p.nvme_read_Bps / share, p.nvme_write_Bps / share)->seal());
    root.push_back(
        zone->create_link("pcie-root-" + N, p.pcie_aggregate_Bps / share)->set_latency(kLinkLatency_s)->seal());
    if (p.inter_node_Bps > 0) {
      nic.push_back(zone->create_split_duplex_link("nic-" + N, p.inter_node_Bps / share));
      nic.back()->set_latency(kLinkLatency_s)->seal();
    }
    for (int i = 0; i < p.gpus_per_node; ++i) {
      const std::string I = N + "-" + std::to_string(i);
      pf.gpu.push_back(zone->create_host("gpu-" + I, peak));
      nvlink[n].push_back(zone->create_split_duplex_link("nvlink-" + I, nvlink_Bps));
      nvlink[n].back()->set_latency(kLinkLatency_s)->seal();
      pcie[n].push_back(zone->create_link("pcie-" + I, p.pcie_single_gpu_Bps)->set_latency(kLinkLatency_s)->seal());
    }
  }
  if (p.nodes > nodes_built || nodes_built > 1) pf.fabric = zone->create_host("fabric", 1e18);
  pf.peer = zone->create_host("peer", 1e18);

  using LIR = sg4::LinkInRoute;
  auto up = [](sg4::SplitDuplexLink* l) { return LIR(l, LIR::Direction::UP); };
  auto down = [](sg4::SplitDuplexLink* l) { return LIR(l, LIR::Direction::DOWN); };
  for (int n = 0; n < nodes_built; ++n) {
    sg4::Host* cpu = pf.cpu[n];
    for (int i = 0; i < p.gpus_per_node; ++i) {
      sg4::Host* g = pf.gpu_at(n, i);
      zone->add_route(g->get_netpoint(), cpu->get_netpoint(), nullptr, nullptr, {LIR(pcie[n][i]), LIR(root[n])}, true);
      for (int j = 0; j < p.gpus_per_node; ++j) {
        if (j == i) continue;
        zone->add_route(g->get_netpoint(), pf.gpu_at(n, j)->get_netpoint(), nullptr, nullptr,
                        {up(nvlink[n][i]), down(nvlink[n][j])}, false);
      }
      zone->add_route(g->get_netpoint(), pf.peer->get_netpoint(), nullptr, nullptr, {up(nvlink[n][i])}, false);
      zone->add_route(pf.peer->get_netpoint(), g->get_netpoint(), nullptr, nullptr, {down(nvlink[n][i])}, false);
      if (pf.fabric && !nic.empty()) {
        zone->add_route(g->get_netpoint(), pf.fabric->get_netpoint(), nullptr, nullptr,
                        {up(nvlink[n][i]), up(nic[n])}, false);
        zone->add_route(pf.fabric->get_netpoint(), g->get_netpoint(), nullptr, nullptr,
                        {down(nic[n]), down(nvlink[n][i])}, false);
      }
    }
    // Built nodes also reach each other GPU to GPU through both NICs.
    for (int m = 0; m < nodes_built; ++m) {
      if (m == n || nic.empty()) continue;
      for (int i = 0; i < p.gpus_per_node; ++i)
        for (int j = 0; j < p.gpus_per_node; ++j)
          zone->add_route(pf.gpu_at(n, i)->get_netpoint(), pf.gpu_at(m, j)->get_netpoint(), nullptr, nullptr,
                          {up(nvlink[n][i]), up(nic[n]),
                           down(nic[m]), down(nvlink[m][j])},
                          false);
    }
  }
  zone->seal();
  return pf;
}

}  // namespace memwall::sim
