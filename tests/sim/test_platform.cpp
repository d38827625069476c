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

// Starts one transfer per GPU in `gpus` (CPU memory -> GPU, `bytes` each) and returns each finish time.
std::vector<double> cpu_to_gpus(World& w, const Platform& pf, int count, double bytes) {
  std::vector<sg4::CommPtr> comms;
  for (int i = 0; i < count; ++i) {
    comms.push_back(sg4::Comm::sendto_init(pf.cpu[0], pf.gpu_at(0, i)));
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
  Platform pf = build_platform(w.engine, *load_profile("dgx2"), 1, 70e12);
  const double bytes = 12e9;
  std::vector<double> t = cpu_to_gpus(w, pf, 1, bytes);
  // Two links on the route (pcie-0-0 and pcie-root-0): 12 GB / 12 GB/s + 2 latencies.
  EXPECT_NEAR(t[0], bytes / 12e9 + 2 * kLinkLatency_s, 1e-9);
}

TEST(Platform, SixteenGpusShareThePcieRootAtThreeGBpsEach) {
  World w;
  configure_engine(w.engine);
  Platform pf = build_platform(w.engine, *load_profile("dgx2"), 1, 70e12);
  const double bytes = 3e9;
  for (double t : cpu_to_gpus(w, pf, 16, bytes)) EXPECT_NEAR(bytes / (t - 2 * kLinkLatency_s), 3.0e9, 1e3);
}

TEST(Platform, NvmeGivesOnePointSixGBpsPerGpuWithSixteenReaders) {
  World w;
  configure_engine(w.engine);
  Platform pf = build_platform(w.engine, *load_profile("dgx2"), 1, 70e12);
  std::vector<sg4::IoPtr> ios;
  const double bytes = 1.5625e9;
  for (int i = 0; i < 16; ++i) {
    ios.push_back(pf.nvme[0]->io_init(sg_size_t(bytes), sg4::Io::OpType::READ));
    ios.back()->vetoable_start();
  }
  w.engine.run();
  for (auto& io : ios) EXPECT_NEAR(bytes / (io->get_finish_time() - io->get_start_time()), 25e9 / 16, 1e3);
  EXPECT_NEAR(25e9 / 16, 1.6e9, 0.05e9);  // Fig. 2b's "1.6 GB/s per GPU"
}

TEST(Platform, NvlinkTransferIsBytesOverBandwidthPlusLatency) {
  World w;
  configure_engine(w.engine);
  Platform pf = build_platform(w.engine, *load_profile("dgx2"), 1, 70e12);
  sg4::CommPtr c = sg4::Comm::sendto_init(pf.gpu_at(0, 0), pf.gpu_at(0, 1));
  c->set_payload_size(uint64_t(7e9));
  c->vetoable_start();
  // The opposite direction of the same split-duplex links does not slow it down.
  sg4::CommPtr back = sg4::Comm::sendto_init(pf.gpu_at(0, 1), pf.gpu_at(0, 0));
  back->set_payload_size(uint64_t(7e9));
  back->vetoable_start();
  w.engine.run();
  EXPECT_NEAR(c->get_finish_time(), 7e9 / 70e9 + 2 * kLinkLatency_s, 1e-9);
  EXPECT_NEAR(back->get_finish_time(), 7e9 / 70e9 + 2 * kLinkLatency_s, 1e-9);
}

TEST(Platform, ComputeTakesFlopsOverPeak) {
  World w;
  configure_engine(w.engine);
  Platform pf = build_platform(w.engine, *load_profile("dgx2"), 1, 70e12);
  sg4::ExecPtr e = sg4::Exec::init();
  e->set_host(pf.gpu_at(0, 3))->set_flops_amount(140e12);
  e->vetoable_start();
  w.engine.run();
  EXPECT_DOUBLE_EQ(e->get_finish_time(), 2.0);
}

TEST(Platform, SymmetricShareGivesOneGpuItsPart) {
  World w;
  configure_engine(w.engine);
  Platform pf = build_platform(w.engine, *load_profile("dgx2"), 1, 70e12, 16);
  std::vector<double> t = cpu_to_gpus(w, pf, 1, 3e9);  // one GPU alone sees 48/16 GB/s
  EXPECT_NEAR(3e9 / (t[0] - 2 * kLinkLatency_s), 3.0e9, 1e3);
}

}  // namespace
}  // namespace memwall::sim
