#include "model/analysis.hpp"

#include <algorithm>
#include <cmath>

#include "model/operator_graph.hpp"
#include "model/units.hpp"

namespace memwall {

double params_eq1(int nl, long hd) { return 12.0 * nl * double(hd) * double(hd); }
double model_state_bytes_eq2(int nl, long hd) { return 240.0 * nl * double(hd) * double(hd); }
double act_ckpt_bytes_eq3(double bsz, long seq, long hd, int nl, int ci) {
  return 2.0 * bsz * double(seq) * double(hd) * nl / ci;
}
double mswm_bytes_eq4(long hd) { return 4.0 * double(hd) * 4.0 * double(hd); }
double awm_bytes_eq5(double bsz, long seq, int ci, long hd, int heads, double attention_density) {
  return bsz * double(seq) * ci * (16.0 * double(hd) + 2.0 * heads * double(seq) * attention_density);
}
namespace {
// The graph's param_elems (or active_param_elems) in closed form, without building the graph: the
// planner asks for it once per candidate (a test holds the two equal).
double graph_params(const ModelSpec& m, bool active) {
  double block = 0;
  for (const BlockParamOp& op : block_param_ops(m))
    block += active && op.copies > 1 ? op.elems / op.copies * op.active : op.elems;
  return m.layers * block + embed_param_elems(m, m.seq) + norm_param_elems(m) + head_param_elems(m);
}
}  // namespace
double model_param_count(const ModelSpec& m) { return graph_params(m, false); }
double active_param_count(const ModelSpec& m) { return graph_params(m, true); }
double analysis_param_count(const ModelSpec& m, bool active) {
  return m.paper_gpt() ? params_eq1(m.layers, m.hidden) : graph_params(m, active);
}
double mswm_bytes(const ModelSpec& m) {
  double largest = 0;
  for (const BlockParamOp& op : block_param_ops(m))
    if (op.linear) largest = std::max(largest, double(op.in) * double(op.out));
  return 4.0 * largest;
}
double awm_bytes(const ModelSpec& m, double bsz, long seq, int ci, double attention_density) {
  double ffn = 0;  // fp16 elements per token: fc1's outputs and the activation's
  for (const BlockParamOp& op : block_param_ops(m))
    if (op.role == OpRole::fc1) ffn = op.active * (double(op.out) + double(op.out / (m.gated() ? 2 : 1)));
  return bsz * double(seq) * ci *
         (2.0 * ffn + 2.0 * m.heads * double(seq) * attention_share(m, seq, attention_density));
}
double active_weight_share(const ModelSpec& m) {
  double all = 0, active = 0;
  for (const BlockParamOp& op : block_param_ops(m))
    if (op.linear) {
      all += op.copies * double(op.in) * double(op.out);
      active += op.active * double(op.in) * double(op.out);
    }
  return all > 0 ? active / all : 1.0;
}
double ait_act_ckpt(const ModelSpec& m, int ci) { return ait_act_ckpt(m, ci, active_block_weight_elems(m)); }
double ait_act_ckpt(const ModelSpec& m, int ci, double block_weights) {
  return 8.0 * block_weights * ci / (4.0 * double(m.hidden));
}
double onebit_bytes(double bytes, double elem_bytes, double pieces) { return bytes / (8.0 * elem_bytes) + 4.0 * pieces; }
double onebit_end_to_end(double plain, double compressed, double warmup) {
  return warmup * plain + (1.0 - warmup) * compressed;
}
double computation_flops_eq7(double bsz, long seq, double params) { return 2.0 * 4.0 * bsz * double(seq) * params; }
double ait_param_grad_eq9(double bsz, long seq) { return double(seq) * bsz; }
double ait_optimizer_eq10(double bsz, long seq) { return double(seq) * bsz / 4.0; }
double ait_act_ckpt_eq11(long hd, int ci) { return 24.0 * double(hd) * ci; }
double efficiency_eq6(double ait, double bw_Bps, double peak_flops_per_s) {
  return ait * bw_Bps / (ait * bw_Bps + peak_flops_per_s);
}
double bandwidth_for_efficiency(double ait, double efficiency, double peak_flops_per_s) {
  return efficiency * peak_flops_per_s / ((1.0 - efficiency) * ait);
}

const char* to_string(AitState s) {
  switch (s) {
    case AitState::param_grad: return "param_grad";
    case AitState::optimizer: return "optimizer";
    case AitState::act_ckpt: return "act_ckpt";
  }
  return "?";
}

std::vector<StateTierEfficiency> tier_efficiencies(const HardwareProfile& p, const ModelSpec& m,
                                                   const TrainingConfig& c, int dp) {
  const double peak = p.peak_flops_per_s(m.hidden);
  // one pipeline stage's GPUs (its dp x mp; the stages go across nodes, each with its own share)
  const long gpus = long(dp) * c.mp;
  const int nodes_used = p.nodes_for(gpus);
  // A GPU receives a whole parameter over NVSwitch inside a node; across nodes a hierarchical
  // all-gather brings each parameter into the node once through the node's NICs. With tensor
  // slicing every slice's group gathers its own slice at once through the same NICs: the node takes
  // in the whole layer, each GPU needs 1/mp of it (the simulator's rings: table1-50B on 2 DGX-2
  // nodes, mp 2, bsz 1 was planned at 3.81 s against 6.62 s replayed).
  double allgather_Bps = p.gpu_gpu_Bps;
  std::string allgather_basis = "GPU-GPU link " + format_bandwidth(p.gpu_gpu_Bps);
  if (nodes_used > 1) {
    const int mp = std::max(1, c.mp);
    allgather_Bps = std::min(p.gpu_gpu_Bps, p.inter_node_Bps / mp);
    allgather_basis = "min(GPU-GPU " + format_bandwidth(p.gpu_gpu_Bps) + ", inter-node " +
                      format_bandwidth(p.inter_node_Bps) + " per node" +
                      (mp > 1 ? " / mp " + std::to_string(mp) + ", every slice's gather through the node's NICs" : "") + ")";
  }
  if (dp <= 1) {  // nothing to gather: the slow tier alone limits
    allgather_Bps = INFINITY;
    allgather_basis = "no all-gather (dp 1)";
  }
  // the GPUs of a node that move data at once: all of them, or fewer when the analysis uses fewer
  // (`analyze --gpus 1` gets one GPU's PCIe link, not a sixteenth of the node)
  const int active = int(std::min<long>(p.gpus_per_node, (gpus + nodes_used - 1) / nodes_used));
  const double cpu_gpu = p.cpu_Bps_per_gpu(active);
  const double nvme_gpu = std::min(p.nvme_read_Bps_per_gpu(active), p.nvme_write_Bps_per_gpu(active));
  const std::string share = active == p.gpus_per_node
                                ? std::string("per GPU with all GPUs active")
                                : "per GPU with " + std::to_string(active) + " of the node's " +
                                      std::to_string(p.gpus_per_node) + " GPUs active";
  const std::string dps = std::to_string(dp);

  const double routed = active_weight_share(m);  // 1 for a dense model: Eq. 9-10 as written
  const double ait_pg = ait_param_grad_eq9(c.bsz, c.seq) * routed;
  const double ait_os = ait_optimizer_eq10(c.bsz, c.seq) * routed;
  const double ait_ac = ait_act_ckpt(m, c.ci);

  std::vector<StateTierEfficiency> out;
  auto add = [&](AitState s, std::string tier, std::string basis, double bw, double ait) {
    out.push_back({s, std::move(tier), std::move(basis), bw, ait, efficiency_eq6(ait, bw, peak)});
  };

  if (dp > 1) add(AitState::param_grad, "gpu", "partitioned over GPUs, all-gather at " + allgather_basis,
                  allgather_Bps, ait_pg);
  add(AitState::param_grad, "cpu",
      "min(" + dps + " GPUs x " + format_bandwidth(cpu_gpu) + " CPU->GPU each, " + allgather_basis + ")",
      std::min(dp * cpu_gpu, allgather_Bps), ait_pg);
  add(AitState::param_grad, "cpu-broadcast",
      "one GPU's PCIe link " + format_bandwidth(p.pcie_single_gpu_Bps) + " (ZeRO-Offload broadcast)",
      p.pcie_single_gpu_Bps, ait_pg);
  add(AitState::param_grad, "nvme",
      "min(" + dps + " GPUs x " + format_bandwidth(nvme_gpu) + " NVMe->GPU each, " + allgather_basis + ")",
      std::min(dp * nvme_gpu, allgather_Bps), ait_pg);

  const double nvme_rw = 2.0 / (1.0 / p.nvme_read_Bps + 1.0 / p.nvme_write_Bps);  // read once, write once
  add(AitState::optimizer, "cpu",
      std::to_string(nodes_used) + " node(s) x CPU memory " + format_bandwidth(p.cpu_memory_Bps) + " (CPU Adam)",
      nodes_used * p.cpu_memory_Bps, ait_os);
  add(AitState::optimizer, "nvme",
      std::to_string(nodes_used) + " node(s) x NVMe " + format_bandwidth(nvme_rw) + " (read and write once)",
      nodes_used * nvme_rw, ait_os);

  add(AitState::act_ckpt, "cpu", share + ", " + format_bandwidth(cpu_gpu), cpu_gpu, ait_ac);
  add(AitState::act_ckpt, "nvme", share + ", " + format_bandwidth(nvme_gpu), nvme_gpu, ait_ac);
  return out;
}

Analysis analyze(const ModelSpec& m, const TrainingConfig& c, const HardwareProfile& p, int gpus) {
  Analysis a;
  a.model = m;
  a.config = c;
  a.profile_name = p.name;
  a.gpus = gpus > 0 ? gpus : p.total_gpus();
  const int dp = c.dp > 0 ? c.dp : std::max(1, a.gpus / c.mp);
  a.peak_flops_per_s = p.peak_flops_per_s(m.hidden);
  a.params = analysis_param_count(m);
  a.active_params = analysis_param_count(m, true);
  a.model_state_bytes = m.paper_gpt() ? model_state_bytes_eq2(m.layers, m.hidden) : 20.0 * a.params;
  a.act_ckpt_bytes_per_gpu = act_ckpt_bytes_eq3(c.bsz, c.seq, m.hidden, m.layers, c.ci);
  a.act_ckpt_bytes_total = act_ckpt_bytes_eq3(c.bsz * dp, c.seq, m.hidden, m.layers, c.ci);
  a.mswm_bytes = mswm_bytes(m);
  a.awm_bytes = awm_bytes(m, c.bsz, c.seq, c.ci);
  a.computation_flops = computation_flops_eq7(c.bsz, c.seq, a.active_params);
  const double share = active_weight_share(m);
  a.ait_param_grad = ait_param_grad_eq9(c.bsz, c.seq) * share;
  a.ait_optimizer = ait_optimizer_eq10(c.bsz, c.seq) * share;
  a.ait_act_ckpt = ait_act_ckpt(m, c.ci);
  a.efficiencies = tier_efficiencies(p, m, c, dp);

  const int nodes_used = p.nodes_for(a.gpus);
  const double gpu_all = a.gpus * p.gpu_memory_bytes;
  const double cpu_all = nodes_used * p.cpu_memory_bytes;
  const double nvme_all = nodes_used * p.nvme_capacity_bytes;
  a.fits = {
      {"model states", "gpu", "all GPUs", a.model_state_bytes, gpu_all},
      {"model states", "cpu", "all nodes", a.model_state_bytes, cpu_all},
      {"model states", "nvme", "all nodes", a.model_state_bytes, nvme_all},
      {"activation checkpoints", "gpu", "one GPU", a.act_ckpt_bytes_per_gpu, p.gpu_memory_bytes},
      {"activation checkpoints", "cpu", "all nodes", a.act_ckpt_bytes_total, cpu_all},
      {"MSWM", "gpu", "one GPU", a.mswm_bytes, p.gpu_memory_bytes},
      {"AWM", "gpu", "one GPU", a.awm_bytes, p.gpu_memory_bytes},
  };
  return a;
}

std::vector<Table3Row> table3(double v100_peak_flops_per_s, long seq, int devices) {
  std::vector<Table3Row> rows;
  for (double mult : {1.0, 10.0, 100.0}) {
    Table3Row r;
    r.compute_multiplier = mult;
    r.devices = devices;
    r.peak_flops_per_s = v100_peak_flops_per_s * mult;
    // Slow memory: 20 B/param of model states read and 20 written: AIT = 8·bsz·seq / 40 at bsz 2.
    const double bsz_slow = 2;
    const double ait_slow = 8.0 * bsz_slow * double(seq) / 40.0;
    r.slow_memory_aggregate_Bps = bandwidth_for_efficiency(ait_slow, 0.9, r.peak_flops_per_s);
    r.slow_memory_Bps_per_device = r.slow_memory_aggregate_Bps / devices;
    r.optimizer_only_Bps_per_device =
        bandwidth_for_efficiency(ait_optimizer_eq10(bsz_slow, seq), 0.9, r.peak_flops_per_s) / devices;
    r.gpu_gpu_Bps = bandwidth_for_efficiency(ait_param_grad_eq9(1, seq), 0.5, r.peak_flops_per_s);
    rows.push_back(r);
  }
  return rows;
}

std::vector<SweepPoint> fig3_series(Fig3Panel panel, double bsz, long hidden, double peak, long seq, int ci) {
  std::vector<SweepPoint> out;
  auto emit = [&](const char* name, const std::string& series, double b, long h, double ait) {
    for (int i = 0; i <= 50; ++i) {  // 0.1 GB/s .. 10 TB/s, 10 points per decade
      const double bw = 1e8 * std::pow(10.0, i / 10.0);
      out.push_back({name, series, b, h, bw, ait, efficiency_eq6(ait, bw, peak)});
    }
  };
  switch (panel) {
    case Fig3Panel::a_param_grad: emit("fig3a", "bsz=" + format_g(bsz), bsz, 0, ait_param_grad_eq9(bsz, seq)); break;
    case Fig3Panel::b_optimizer: emit("fig3b", "bsz=" + format_g(bsz), bsz, 0, ait_optimizer_eq10(bsz, seq)); break;
    case Fig3Panel::c_act_ckpt:
      emit("fig3c", "hidden=" + std::to_string(hidden), 0, hidden, ait_act_ckpt_eq11(hidden, ci));
      break;
  }
  return out;
}

std::vector<SweepPoint> fig3_sweep(Fig3Panel panel, double peak, long seq, int ci) {
  std::vector<SweepPoint> out;
  auto append = [&](std::vector<SweepPoint> s) { out.insert(out.end(), s.begin(), s.end()); };
  if (panel == Fig3Panel::c_act_ckpt) {
    for (long h : {2048L, 4096L, 8192L, 16384L, 32768L, 65536L}) append(fig3_series(panel, 0, h, peak, seq, ci));
  } else {
    for (double b : {1, 2, 4, 8, 16}) append(fig3_series(panel, b, 0, peak, seq, ci));
  }
  return out;
}

}  // namespace memwall
