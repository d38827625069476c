#include "sim/platform.hpp"

#include <algorithm>
#include <string>

namespace memwall::sim {

void configure_engine(sg4::Engine& engine) {
  (void)engine;
  // SimGrid's default LV08 model multiplies latency by 13.01, bandwidth by 0.97 and adds reverse
  // cross-traffic: right for TCP over Ethernet, wrong for PCIe and NVLink. CM02 is plain max-min
  // sharing; set every correction to neutral so that an idle link gives B/W exactly. CM02 also
  // divides a link among flows in inverse proportion to their routes' latencies, which is why the
  // links built here have none.
  sg4::Engine::set_config("network/model:CM02");
  sg4::Engine::set_config("network/latency-factor:1.0");
  sg4::Engine::set_config("network/bandwidth-factor:1.0");
  sg4::Engine::set_config("network/crosstraffic:0");
  sg4::Engine::set_config("network/TCP-gamma:0");  // no TCP window bound on the rate
  sg4::Engine::set_config("network/weight-S:0");   // no bandwidth-based weighting of flows
}

const std::vector<sg4::Link*>& Platform::route(sg4::Host* a, sg4::Host* b) const {
  auto [it, fresh] = routes_.try_emplace({a, b});
  if (fresh) {
    double latency = 0;
    a->route_to(b, it->second, &latency);
  }
  return it->second;
}

std::string link_class(const sg4::Link& link) {
  const std::string& name = link.get_name();
  const std::string kind = name.substr(0, name.find('-'));
  if (kind == "pcieroot") return "pcie_root";
  if (kind == "nvmeread" || kind == "nvmewrite") return "nvme";
  if (kind == "nic") return "network";
  return kind;  // pcie, nvlink, dram, nvme, cpu
}

//   One node of a DGX-2 (16 GPUs; other profiles differ in counts, capacities and nic_attach):
//
//              NVSwitch
//        ┌──────┬───────┴──┬───────────┐      nvlink-N-i: split duplex, links.gpu_gpu each way (70 GB/s)
//      GPU0   GPU1   ...  GPU14      GPU15    hosts "gpu-N-i", speed = achievable peak
//        │      │          │           │
//      pcie   pcie       pcie        pcie     pcie-N-i: split duplex, links.pcie_single_gpu (12 GB/s)
//        ├─────────nic-N (nic_attach: pcie_switch; links.inter_node, split duplex, 800 Gbps)
//        └──────┴────┬─────┴───────────┘
//              pcieroot-N                     split duplex, links.pcie_aggregate (48 GB/s = 3.0 x 16)
//          ┌─────────┼─────────────┐          (nic_attach: cpu puts nic-N here instead)
//     nvme-N (nvme.read/.write)  dram-N       cpu.memory_bandwidth, shared by reads and writes (100 GB/s)
//     host "nvme-N"                │          host "dram-N": where every transfer to or from CPU memory ends
//                               cpu-N         cpu.adam_throughput x 30 B: the CPU cores running Adam
//                                  │
//                              host "adam-N"  CPU Adam = a flow of 30 B per parameter dram-N -> adam-N
//
// Routes: GPU -> CPU memory: pcie up, pcieroot up, dram. NVMe read: nvmeread, nvme, pcieroot up,
// dram (nvme-N is the drives' shared bandwidth, max(read, write); reads and writes also have their
// own). GPU -> GPU in a node: nvlink up, nvlink down. GPU -> GPU in another node: the NIC path (pcie
// up, or pcie up and pcieroot up), nic up, the other node's nic down and NIC path down.
// Stand-ins (symmetric shape): peer <-> GPU is the GPU's own nvlink; fabric <-> GPU is this node's
// NIC path and NIC (the far side's links carry the mirror of this node's traffic).
// One function of ~100 lines on purpose: it builds the picture above top to bottom, link by link,
// and reads best beside it (SimGrid's own platform builders are written the same way).
Platform build_platform(sg4::Engine& engine, const HardwareProfile& p, const PlatformShape& shape, double peak) {
  (void)engine;
  Platform pf;
  pf.nodes = shape.nodes;
  pf.gpus_per_node = shape.gpus_per_node;
  const double share = std::max(1, shape.share);
  auto* zone = sg4::create_full_zone("cluster");
  using LIR = sg4::LinkInRoute;
  auto up = [](sg4::SplitDuplexLink* l) { return LIR(l, LIR::Direction::UP); };
  auto down = [](sg4::SplitDuplexLink* l) { return LIR(l, LIR::Direction::DOWN); };
  // No latency on links: CM02 shares a link among flows in inverse proportion to their routes'
  // latencies (TCP's RTT unfairness), which PCIe, NVLink and InfiniBand do not do. A collective's
  // step latency is a delay of its own (sim/replay.cpp, path_rates).
  auto duplex = [&](const std::string& name, double bw) {
    sg4::SplitDuplexLink* l = zone->create_split_duplex_link(name, bw);
    l->seal();
    return l;
  };
  auto link = [&](const std::string& name, double bw) { return zone->create_link(name, bw)->seal(); };

  const double nvlink_Bps = p.gpu_gpu_Bps > 0 ? p.gpu_gpu_Bps : p.pcie_single_gpu_Bps;
  const double nic_Bps = p.inter_node_Bps > 0 ? p.inter_node_Bps : p.pcie_single_gpu_Bps;
  const bool nic_on_root = p.nic_attach == NicAttach::cpu;
  std::vector<sg4::SplitDuplexLink*> root, nic;
  std::vector<sg4::Link*> dram;
  std::vector<std::vector<sg4::SplitDuplexLink*>> nvlink(size_t(shape.nodes)), pcie(size_t(shape.nodes));
  for (int n = 0; n < shape.nodes; ++n) {
    const std::string N = std::to_string(n);
    pf.dram.push_back(zone->create_host("dram-" + N, 1));
    pf.nvme.push_back(zone->create_host("nvme-" + N, 1));
    pf.adam.push_back(zone->create_host("adam-" + N, 1));
    // in the replay's units (peak = this model's achievable peak, the speed of a GPU alone)
    if (p.gpu_shared_peak_flops_per_s > 0)
      pf.cores.push_back(zone->create_host("cores-" + N, peak * p.gpu_shared_peak_flops_per_s / p.gpu_peak_flops_per_s));
    root.push_back(duplex("pcieroot-" + N, p.pcie_aggregate_Bps / share));
    nic.push_back(duplex("nic-" + N, nic_Bps / share));
    dram.push_back(link("dram-" + N, p.cpu_memory_Bps / share));
    sg4::Link* drives = link("nvme-" + N, std::max(p.nvme_read_Bps, p.nvme_write_Bps) / share);
    sg4::Link* rd = link("nvmeread-" + N, p.nvme_read_Bps / share);
    sg4::Link* wr = link("nvmewrite-" + N, p.nvme_write_Bps / share);
    sg4::Link* cores = link("cpu-" + N, p.cpu_adam_params_per_s * kAdamBytesPerParam / share);
    zone->add_route(pf.nvme[n]->get_netpoint(), pf.dram[n]->get_netpoint(), nullptr, nullptr,
                    {LIR(rd), LIR(drives), up(root[n]), LIR(dram[n])}, false);
    zone->add_route(pf.dram[n]->get_netpoint(), pf.nvme[n]->get_netpoint(), nullptr, nullptr,
                    {LIR(dram[n]), down(root[n]), LIR(drives), LIR(wr)}, false);
    zone->add_route(pf.dram[n]->get_netpoint(), pf.adam[n]->get_netpoint(), nullptr, nullptr,
                    {LIR(dram[n]), LIR(cores)}, false);
    for (int i = 0; i < shape.gpus_per_node; ++i) {
      const std::string I = N + "-" + std::to_string(i);
      pf.gpu.push_back(zone->create_host("gpu-" + I, peak));
      nvlink[size_t(n)].push_back(duplex("nvlink-" + I, nvlink_Bps));
      pcie[size_t(n)].push_back(duplex("pcie-" + I, p.pcie_single_gpu_Bps));
    }
  }
  pf.clock = zone->create_host("clock", pf.clock_speed)->set_core_count(1 << 20);
  if (shape.stand_ins) {
    pf.peer = zone->create_host("peer", 1);
    pf.fabric = zone->create_host("fabric", 1);
  }

  // The GPU's way to its node's NICs, towards them (up) or from them (down).
  auto nic_path = [&](int n, int i, bool towards) {
    std::vector<LIR> r = {towards ? up(pcie[size_t(n)][size_t(i)]) : down(pcie[size_t(n)][size_t(i)])};
    if (nic_on_root) r.push_back(towards ? up(root[size_t(n)]) : down(root[size_t(n)]));
    return r;
  };
  for (int n = 0; n < shape.nodes; ++n)
    for (int i = 0; i < shape.gpus_per_node; ++i) {
      sg4::Host* g = pf.gpu_at(n, i);
      auto& pl = pcie[size_t(n)][size_t(i)];
      auto& nv = nvlink[size_t(n)][size_t(i)];
      zone->add_route(g->get_netpoint(), pf.dram[n]->get_netpoint(), nullptr, nullptr,
                      {up(pl), up(root[n]), LIR(dram[n])}, false);
      zone->add_route(pf.dram[n]->get_netpoint(), g->get_netpoint(), nullptr, nullptr,
                      {LIR(dram[n]), down(root[n]), down(pl)}, false);
      for (int j = 0; j < shape.gpus_per_node; ++j)
        if (j != i)
          zone->add_route(g->get_netpoint(), pf.gpu_at(n, j)->get_netpoint(), nullptr, nullptr,
                          {up(nv), down(nvlink[size_t(n)][size_t(j)])}, false);
      for (int m = 0; m < shape.nodes; ++m) {
        if (m == n) continue;
        for (int j = 0; j < shape.gpus_per_node; ++j) {
          std::vector<LIR> r = nic_path(n, i, true);
          r.push_back(up(nic[size_t(n)]));
          r.push_back(down(nic[size_t(m)]));
          for (const LIR& x : nic_path(m, j, false)) r.push_back(x);
          zone->add_route(g->get_netpoint(), pf.gpu_at(m, j)->get_netpoint(), nullptr, nullptr, r, false);
        }
      }
      if (!shape.stand_ins) continue;
      zone->add_route(g->get_netpoint(), pf.peer->get_netpoint(), nullptr, nullptr, {up(nv)}, false);
      zone->add_route(pf.peer->get_netpoint(), g->get_netpoint(), nullptr, nullptr, {down(nv)}, false);
      std::vector<LIR> out = nic_path(n, i, true);
      out.push_back(up(nic[size_t(n)]));
      zone->add_route(g->get_netpoint(), pf.fabric->get_netpoint(), nullptr, nullptr, out, false);
      std::vector<LIR> in = {down(nic[size_t(n)])};
      for (const LIR& x : nic_path(n, i, false)) in.push_back(x);
      zone->add_route(pf.fabric->get_netpoint(), g->get_netpoint(), nullptr, nullptr, in, false);
    }
  zone->seal();
  return pf;
}

}  // namespace memwall::sim
