// The platform built from a profile: the profile's numbers come out as measured by SimGrid
// transfers, and an idle link gives B/W + latency exactly (no TCP corrections).
// SimGrid allows one engine per process; CTest runs each test in its own process.
#include <gtest/gtest.h>

#include "sim/platform.hpp"

namespace memwall::sim {
namespace {

struct World {
  int argc = 2;
  char name[8] = "test";
  char quiet[32] = "--log=root.thres:warning";
  char* argv[3] = {name, quiet, nullptr};
  sg4::Engine engine{&argc, argv};
};

PlatformShape whole_node() { return {1, 16, 1, false}; }

// Starts one transfer per GPU in `gpus` (CPU memory -> GPU, `bytes` each) and returns each finish time.
std::vector<double> cpu_to_gpus(World& w, const Platform& pf, int count, double bytes) {
  std::vector<sg4::CommPtr> comms;
  for (int i = 0; i < count; ++i) {
    comms.push_back(sg4::Comm::sendto_init(pf.dram[0], pf.gpu_at(0, i)));
    comms.back()->set_payload_size(uint64_t(bytes));
    comms.back()->vetoable_start();
  }
  w.engine.run();
  std::vector<double> t;
  for (auto& c : comms) t.push_back(c->get_finish_time() - c->get_start_time());
  return t;
}

TEST(Platform, LoneGpuReadsCpuMemoryAtTwelveGBps) {
  World w;
  configure_engine(w.engine);
  Platform pf = build_platform(w.engine, *load_profile("dgx2"), whole_node(), 70e12);
  const double bytes = 12e9;
  std::vector<double> t = cpu_to_gpus(w, pf, 1, bytes);
  // No latency on links (collectives add their steps' own): 12 GB / 12 GB/s.
  EXPECT_NEAR(t[0], bytes / 12e9, 1e-9);
}

TEST(Platform, SixteenGpusShareThePcieRootAtThreeGBpsEach) {
  World w;
  configure_engine(w.engine);
  Platform pf = build_platform(w.engine, *load_profile("dgx2"), whole_node(), 70e12);
  const double bytes = 3e9;
  for (double t : cpu_to_gpus(w, pf, 16, bytes)) EXPECT_NEAR(bytes / t, 3.0e9, 1e3);
}

TEST(Platform, NvmeGivesOnePointSixGBpsPerGpuWithSixteenReaders) {
  World w;
  configure_engine(w.engine);
  Platform pf = build_platform(w.engine, *load_profile("dgx2"), whole_node(), 70e12);
  std::vector<sg4::CommPtr> reads;
  const double bytes = 1.5625e9;
  for (int i = 0; i < 16; ++i) {
    reads.push_back(sg4::Comm::sendto_init(pf.nvme[0], pf.dram[0]));
    reads.back()->set_payload_size(uint64_t(bytes));
    reads.back()->vetoable_start();
  }
  w.engine.run();
  for (auto& r : reads) EXPECT_NEAR(bytes / r->get_finish_time(), 25e9 / 16, 1e3);
  EXPECT_NEAR(25e9 / 16, 1.6e9, 0.05e9);  // Fig. 2b's "1.6 GB/s per GPU"
}

TEST(Platform, NvlinkTransferIsBytesOverBandwidthPlusLatency) {
  World w;
  configure_engine(w.engine);
  Platform pf = build_platform(w.engine, *load_profile("dgx2"), whole_node(), 70e12);
  sg4::CommPtr c = sg4::Comm::sendto_init(pf.gpu_at(0, 0), pf.gpu_at(0, 1));
  c->set_payload_size(uint64_t(7e9));
  c->vetoable_start();
  // The opposite direction of the same split-duplex links does not slow it down.
  sg4::CommPtr back = sg4::Comm::sendto_init(pf.gpu_at(0, 1), pf.gpu_at(0, 0));
  back->set_payload_size(uint64_t(7e9));
  back->vetoable_start();
  w.engine.run();
  EXPECT_NEAR(c->get_finish_time(), 7e9 / 70e9, 1e-9);
  EXPECT_NEAR(back->get_finish_time(), 7e9 / 70e9, 1e-9);
}

TEST(Platform, ComputeTakesFlopsOverPeak) {
  World w;
  configure_engine(w.engine);
  Platform pf = build_platform(w.engine, *load_profile("dgx2"), whole_node(), 70e12);
  sg4::ExecPtr e = sg4::Exec::init();
  e->set_host(pf.gpu_at(0, 3))->set_flops_amount(140e12);
  e->vetoable_start();
  w.engine.run();
  EXPECT_DOUBLE_EQ(e->get_finish_time(), 2.0);
}

TEST(Platform, SymmetricShareGivesOneGpuItsPart) {
  World w;
  configure_engine(w.engine);
  Platform pf = build_platform(w.engine, *load_profile("dgx2"), PlatformShape{1, 1, 16, true}, 70e12);
  std::vector<double> t = cpu_to_gpus(w, pf, 1, 3e9);  // one GPU alone sees 48/16 GB/s
  EXPECT_NEAR(3e9 / t[0], 3.0e9, 1e3);
}

// Starts a flow of `bytes` from `a` to `b` and returns it (run the engine, then read its times).
sg4::CommPtr flow(sg4::Host* a, sg4::Host* b, double bytes) {
  sg4::CommPtr c = sg4::Comm::sendto_init(a, b);
  c->set_payload_size(uint64_t(bytes));
  c->vetoable_start();
  return c;
}
// Bytes per second a finished flow saw.
double seen_Bps(const sg4::CommPtr& c, double bytes) { return bytes / (c->get_finish_time() - c->get_start_time()); }

// Two flows sharing a link fairly, however long their routes: SimGrid's CM02 would weight them by
// their routes' latencies (TCP's RTT unfairness) if the links had any.
TEST(Contention, FlowsShareALinkFairlyWhateverTheirRoutes) {
  World w;
  configure_engine(w.engine);
  Platform pf = build_platform(w.engine, *scale_to_nodes(*load_profile("dgx2"), 2), {2, 16, 1, false}, 70e12);
  sg4::CommPtr near = flow(pf.dram[0], pf.gpu_at(0, 0), 6e9);    // dram, pcieroot down, pcie down
  sg4::CommPtr far = flow(pf.gpu_at(1, 5), pf.gpu_at(0, 0), 6e9);  // pcie, nic, nic, pcie down
  w.engine.run();
  EXPECT_NEAR(seen_Bps(near, 6e9), 6e9, 1e3);
  EXPECT_NEAR(seen_Bps(far, 6e9), 6e9, 1e3);
}

// DGX-2's NICs sit on the PCIe switches: a GPU's inter-node traffic and its offload to CPU memory
// share its PCIe link (12 GB/s: 6 each), not the node's PCIe root.
TEST(Contention, NicOnThePcieSwitchSharesTheGpusPcieLink) {
  World w;
  configure_engine(w.engine);
  Platform pf = build_platform(w.engine, *scale_to_nodes(*load_profile("dgx2"), 2), {2, 16, 1, false}, 70e12);
  const double bytes = 6e9;
  sg4::CommPtr out = flow(pf.gpu_at(0, 0), pf.gpu_at(1, 0), bytes);   // pcie up, nic up, nic down, pcie down
  sg4::CommPtr offload = flow(pf.gpu_at(0, 0), pf.dram[0], bytes);  // pcie up, pcieroot up, dram
  w.engine.run();
  EXPECT_NEAR(seen_Bps(out, bytes), 6e9, 1e3);
  EXPECT_NEAR(seen_Bps(offload, bytes), 6e9, 1e3);
}

// A NIC behind the CPU (nic_attach: cpu) puts inter-node traffic on the PCIe root: 16 GPUs sending
// to another node get 48/16 = 3 GB/s each, not the NICs' 100/16.
TEST(Contention, NicBehindTheCpuCrossesThePcieRoot) {
  World w;
  configure_engine(w.engine);
  HardwareProfile p = *scale_to_nodes(*load_profile("dgx2"), 2);
  p.nic_attach = NicAttach::cpu;
  Platform pf = build_platform(w.engine, p, {2, 16, 1, false}, 70e12);
  std::vector<sg4::CommPtr> out;
  for (int i = 0; i < 16; ++i) out.push_back(flow(pf.gpu_at(0, i), pf.gpu_at(1, i), 3e9));
  w.engine.run();
  for (auto& c : out) EXPECT_NEAR(seen_Bps(c, 3e9), 3e9, 1e3);
}

// NVMe reads cross the PCIe root toward the CPU, as GPU offloads do: 16 offloading GPUs and one
// NVMe read share its 48 GB/s evenly.
TEST(Contention, NvmeReadsCrossThePcieRoot) {
  World w;
  configure_engine(w.engine);
  Platform pf = build_platform(w.engine, *load_profile("dgx2"), whole_node(), 70e12);
  const double share = 48e9 / 17, bytes = 1e9;
  std::vector<sg4::CommPtr> out;
  for (int i = 0; i < 16; ++i) out.push_back(flow(pf.gpu_at(0, i), pf.dram[0], bytes));
  sg4::CommPtr read = flow(pf.nvme[0], pf.dram[0], bytes);
  w.engine.run();
  EXPECT_NEAR(seen_Bps(read, bytes), share, 1e3);
  for (auto& c : out) EXPECT_NEAR(seen_Bps(c, bytes), share, 1e3);
}

// NVMe reads and writes share the drives (max(read, write) in all), as SimGrid's disks do.
TEST(Contention, NvmeReadsAndWritesShareTheDrives) {
  World w;
  configure_engine(w.engine);
  Platform pf = build_platform(w.engine, *load_profile("dgx2"), whole_node(), 70e12);
  sg4::CommPtr read = flow(pf.nvme[0], pf.dram[0], 5e9), write = flow(pf.dram[0], pf.nvme[0], 5e9);
  w.engine.run();
  EXPECT_NEAR(seen_Bps(read, 5e9), 12.5e9, 1e3);
  EXPECT_NEAR(seen_Bps(write, 5e9), 12.5e9, 1e3);
}

// CPU Adam is 30 B per parameter through DRAM (results/METRICS.md), at the CPU's rate at most.
TEST(Contention, CpuAdamMovesThirtyBytesPerParameter) {
  World w;
  configure_engine(w.engine);
  HardwareProfile p = *load_profile("dgx2");
  Platform pf = build_platform(w.engine, p, whole_node(), 70e12);
  const double params = 1e9;
  sg4::CommPtr adam = flow(pf.dram[0], pf.adam[0], params * kAdamBytesPerParam);
  w.engine.run();
  EXPECT_NEAR(adam->get_finish_time(), params / p.cpu_adam_params_per_s, 1e-9);
}

// The node's DRAM is one resource: an NVMe read, CPU Adam and a GPU reading CPU memory compete for
// it when it is the narrowest thing on their routes (here 30 GB/s: 10 each).
TEST(Contention, DramIsSharedByNvmeAdamAndGpus) {
  World w;
  configure_engine(w.engine);
  HardwareProfile p = *load_profile("dgx2");
  p.cpu_memory_Bps = 30e9;
  Platform pf = build_platform(w.engine, p, whole_node(), 70e12);
  const double bytes = 5e9;
  sg4::CommPtr read = flow(pf.nvme[0], pf.dram[0], bytes);
  sg4::CommPtr adam = flow(pf.dram[0], pf.adam[0], bytes);
  sg4::CommPtr h2d = flow(pf.dram[0], pf.gpu_at(0, 3), bytes);
  w.engine.run();
  EXPECT_NEAR(seen_Bps(read, bytes), 10e9, 1e3);
  EXPECT_NEAR(seen_Bps(adam, bytes), 10e9, 1e3);
  EXPECT_NEAR(seen_Bps(h2d, bytes), 10e9, 1e3);
}

// PCIe is full duplex: a GPU's offload and its fetch do not slow each other.
TEST(Contention, PcieIsFullDuplex) {
  World w;
  configure_engine(w.engine);
  Platform pf = build_platform(w.engine, *load_profile("dgx2"), whole_node(), 70e12);
  sg4::CommPtr up = flow(pf.gpu_at(0, 0), pf.dram[0], 6e9), down = flow(pf.dram[0], pf.gpu_at(0, 0), 6e9);
  w.engine.run();
  EXPECT_NEAR(seen_Bps(up, 6e9), 12e9, 1e3);
  EXPECT_NEAR(seen_Bps(down, 6e9), 12e9, 1e3);
}

}  // namespace
}  // namespace memwall::sim
