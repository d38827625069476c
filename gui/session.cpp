#include "gui/session.hpp"

#include <algorithm>
#include <exception>

#include "model/units.hpp"

namespace memwall::gui {

std::vector<BandwidthMarker> profile_markers(const HardwareProfile& p) {
  std::vector<BandwidthMarker> all = {
      {"GPU-GPU", p.gpu_gpu_Bps},
      {"PCIe 1 GPU", p.pcie_single_gpu_Bps},
      {"CPU/GPU", p.cpu_Bps_per_gpu_all_active()},
      {"NVMe/GPU", std::min(p.nvme_read_Bps_per_gpu_all_active(), p.nvme_write_Bps_per_gpu_all_active())},
  };
  std::vector<BandwidthMarker> out;
  for (auto& m : all)
    if (m.bw_Bps > 0) out.push_back(m);
  return out;
}

PanelData panel_data(const Session& s, Fig3Panel panel) {
  PanelData d;
  d.panel = panel;
  const TrainingConfig& c = s.config;
  for (const SweepPoint& p : fig3_sweep(panel, s.peak_flops_per_s, c.seq, c.ci)) {
    if (d.family.empty() || d.family.back().front().series != p.series) d.family.emplace_back();
    d.family.back().push_back(p);
  }
  d.config_curve = fig3_series(panel, c.bsz, s.model.hidden, s.peak_flops_per_s, c.seq, c.ci);
  const double ait = d.config_curve.front().ait;
  for (const BandwidthMarker& m : profile_markers(s.profile))
    d.markers.push_back({m.name, m.bw_Bps, efficiency_eq6(ait, m.bw_Bps, s.peak_flops_per_s)});
  d.caption = "seq " + std::to_string(c.seq) + (panel == Fig3Panel::c_act_ckpt ? ", ci " + std::to_string(c.ci) : "") +
              ", peak " + format_flops_rate(s.peak_flops_per_s) + "; markers: " + s.profile.name + " (" +
              std::to_string(s.profile.gpus_per_node) + " GPUs per node)";
  return d;
}

Result<MemoryData> memory_data(const Session& s) {
  Result<Placement> pl = preset(s.placement);
  if (!pl) return make_error(pl.error());
  Result<Schedule> sched = [&]() -> Result<Schedule> {
    try {
      return build_schedule(s.model, *pl, s.config, s.profile, 0);
    } catch (const std::exception& e) {  // the generator throws only on its own bugs; keep the window alive
      return make_error(std::string("schedule: ") + e.what());
    }
  }();
  if (!sched) return make_error(sched.error());
  const Schedule& sc = *sched;
  MemoryData m;
  m.placement = s.placement;
  m.dp = sc.dp;
  m.rank = sc.rank;
  for (int t = 0; t < 3; ++t) {
    TierMemory& tm = m.tiers[t];
    tm.persistent_bytes = sc.persistent_bytes[t];
    double persistent = 0;
    for (double b : tm.persistent_bytes) persistent += b;
    tm.peak_bytes = sc.peak_bytes[t];
    tm.capacity_bytes = sc.capacity_bytes[t];
    tm.transient_bytes = std::max(0.0, tm.peak_bytes - persistent);
  }
  if (sc.overflow) m.overflow = sc.overflow->message;
  return m;
}

Result<Session> make_session(const SessionRequest& r) {
  Session s;
  Result<HardwareProfile> p = load_profile(r.profile);
  if (!p) return make_error(p.error());
  s.profile = *p;
  if (r.layers > 0) {
    Result<long> hd = parse_hidden(r.hidden);
    if (!hd) return make_error("--hidden: " + hd.error());
    Result<ModelSpec> m = model_from_shape(r.layers, *hd, r.heads);
    if (!m) return make_error(m.error());
    s.model = *m;
  } else {
    Result<ModelSpec> m = load_model(r.model);
    if (!m) return make_error(m.error());
    s.model = *m;
  }
  s.config.bsz = r.bsz;
  s.config.seq = r.seq > 0 ? r.seq : s.model.seq;
  s.config.ci = r.ci;
  Result<TrainingConfig> c = validate(s.config, s.model.layers);
  if (!c) return make_error(c.error());
  s.peak_flops_per_s = s.profile.gpu_peak_flops_per_s;
  if (!r.peak.empty()) {
    Result<double> pk = parse_quantity(r.peak, Dimension::flops_rate);
    if (!pk) return make_error("--peak: " + pk.error());
    if (!(*pk > 0)) return make_error("--peak: expected a positive compute rate");
    s.peak_flops_per_s = *pk;
  }
  Result<Placement> pl = preset(r.placement);
  if (!pl) return make_error(pl.error());
  s.placement = r.placement;
  return s;
}

}  // namespace memwall::gui
