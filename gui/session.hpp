// Session: what the window (or a headless export) is looking at: a hardware profile (possibly
// edited for a what-if), a model, a training config, the achievable peak the Fig. 3 panels use and
// a placement preset for the memory view. Plain values; the functions here turn a session into
// the inputs of the charts by calling model/. No Qt widgets, no equations. Any thread.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "model/analysis.hpp"
#include "model/memory.hpp"
#include "model/hardware_profile.hpp"
#include "model/model_spec.hpp"
#include "model/placement.hpp"
#include "model/result.hpp"
#include "model/schedule.hpp"
#include "model/training_config.hpp"

namespace memwall::gui {

struct Session {
  HardwareProfile profile;
  ModelSpec model;
  TrainingConfig config;          // bsz, seq, ci used by every view
  double peak_flops_per_s = 70e12;  // Fig. 3 (the paper uses 70 TFLOPS); set from the profile on load
  std::string placement = "zero_inf_nvme";  // preset for the memory view (and the Simulate tab's default)
};

// A named bandwidth of the profile, drawn as a vertical marker on every Fig. 3 panel.
struct BandwidthMarker {
  std::string name;  // "GPU-GPU", "PCIe 1 GPU", "CPU/GPU", "NVMe/GPU"
  double bw_Bps = 0;
};

// GPU-GPU, one GPU's PCIe link, CPU memory per GPU and NVMe per GPU with all GPUs active
// (min of read and write, as the analysis uses for checkpoints). Zero bandwidths are left out.
std::vector<BandwidthMarker> profile_markers(const HardwareProfile& p);

// One Fig. 3 panel for a session: the paper's family of curves, the curve of the session's own
// bsz (a, b) or hidden size (c), and the markers with the efficiency each gives on that curve.
struct PanelData {
  Fig3Panel panel;
  std::vector<std::vector<SweepPoint>> family;  // one vector per curve, as fig3_sweep orders them
  std::vector<SweepPoint> config_curve;         // fig3_series at the session's bsz or hidden
  struct Marker {
    std::string name;
    double bw_Bps = 0;
    double efficiency = 0;  // efficiency_eq6(config_curve AIT, bw, peak)
  };
  std::vector<Marker> markers;
  std::string caption;  // "seq 1024, ci 1, peak 70.0 TFLOPS; markers: dgx2"
};
// Why the Fig. 3 markers (a GPU's share, every GPU active) differ from the analysis table (the
// node's bandwidth): one sentence with the profile's NVMe figures, shown under the table's title.
std::string markers_note(const Session& s);

PanelData panel_data(const Session& s, Fig3Panel panel);

// Bytes per rank on each tier for the session's placement preset: the memory model's
// (model/memory.hpp): per tier the persistent states, the peak with the buffers of its fullest
// moment, and the capacity; equal to build_schedule's walked peaks.
struct MemoryData {
  std::string placement;
  int dp = 1, rank = 0;
  MemoryModel memory;    // tiers indexed by Tier
  std::string overflow;  // the first tier over its capacity, with its peak's moment; empty when all fit
};
// Rank 0's memory model: microseconds, no schedule is built.
Result<MemoryData> memory_data(const Session& s);

// What a user asks for on the command line; empty strings and zeros mean "the default".
struct SessionRequest {
  std::string profile = "dgx2";      // embedded name or YAML path
  std::string model = "fig2a-1T";    // catalogue name or model YAML; ignored when layers > 0
  int layers = 0;
  std::string hidden;                // "8K" or "8192" (with layers and heads)
  int heads = 0;
  double bsz = 2;
  long seq = 0;                      // 0: the model's
  int ci = 1;
  std::string peak;                  // "70 TFLOPS"; empty: the profile's gpu.peak
  std::string placement = "zero_inf_nvme";
};
// Loads and validates everything; the error is the one line the CLI would print.
Result<Session> make_session(const SessionRequest& r);

}  // namespace memwall::gui
