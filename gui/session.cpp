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

std::string markers_note(const Session& s) {
  const HardwareProfile& p = s.profile;
  return "The panels' markers are one GPU's share with all " + std::to_string(p.gpus_per_node) +
         " GPUs of a node active, where this table quotes the node: NVMe " +
         format_bandwidth(std::min(p.nvme_read_Bps, p.nvme_write_Bps)) + " per node is " +
         format_bandwidth(std::min(p.nvme_read_Bps_per_gpu_all_active(), p.nvme_write_Bps_per_gpu_all_active())) +
         " per GPU (a " + std::to_string(p.gpus_per_node) + "th, or PCIe's share if lower).";
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
  // the model's own intensities where its kind is not the paper's GPT (Eq. 9-11 generalised: a
  // mixture of experts' routed share, its block's weights against its hidden size)
  if (!s.model.paper_gpt()) {
    const double routed = active_weight_share(s.model);
    for (SweepPoint& pt : d.config_curve) {
      pt.ait = panel == Fig3Panel::c_act_ckpt ? ait_act_ckpt(s.model, c.ci) : pt.ait * routed;
      pt.efficiency = efficiency_eq6(pt.ait, pt.bw_Bps, s.peak_flops_per_s);
    }
  }
  const double ait = d.config_curve.front().ait;
  for (const BandwidthMarker& m : profile_markers(s.profile))
    d.markers.push_back({m.name, m.bw_Bps, efficiency_eq6(ait, m.bw_Bps, s.peak_flops_per_s)});
  d.caption = "seq " + std::to_string(c.seq) + (panel == Fig3Panel::c_act_ckpt ? ", ci " + std::to_string(c.ci) : "") +
              ", peak " + format_flops_rate(s.peak_flops_per_s) + "; markers: a GPU's share of " +
              std::to_string(s.profile.gpus_per_node);
  return d;
}

Result<MemoryData> memory_data(const Session& s) {
  Result<Placement> pl = preset(s.placement);
  if (!pl) return make_error(pl.error());
  if (Result<bool> ok = check_optimizer_overlap(*pl, s.config.optimizer_overlap, s.config.grad_clip); !ok) return make_error(ok.error());
  Result<TrainingConfig> c = fit_to_profile(s.config, s.profile);
  if (!c) return make_error(c.error());
  MemoryData m;
  m.placement = s.placement;
  m.dp = c->dp;
  m.rank = 0;
  m.memory = memory_model(s.model, *pl, *c, s.profile);
  for (Tier t : {Tier::gpu, Tier::cpu, Tier::nvme}) {
    const TierMemory& tm = m.memory.of(t);
    if (tm.fits()) continue;
    m.overflow = std::string("out of memory on ") + to_string(t) + ": needs " + format_bytes(tm.peak_bytes) +
                 (tm.moment.empty() ? "" : " at the " + tm.moment) + ", capacity " + format_bytes(tm.capacity_bytes) +
                 " per rank";
    break;
  }
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
