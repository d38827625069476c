// `memwall schedule`: the steps of one rank for one iteration, peak bytes per tier and traffic per
// link class, as text or JSON. The schedule is model/'s; this file only parses and prints.
#include <memory>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "cli/cli_common.hpp"
#include "cli/commands.hpp"
#include "model/memory.hpp"
#include "model/schedule.hpp"
#include "model/units.hpp"

namespace memwall::cli {
namespace {

struct ScheduleFlags {
  ProfileFlags profile;
  ModelFlags model;
  StrategyFlags run;
  int rank = 0;
  int stage = 0;
  bool json = false;
  bool text = false;
  bool full = false;
  std::string output;
};

// Past this many steps the text leaves the step list out unless asked (--full): 32000 layers made
// 472 MB of it.
constexpr std::size_t kListedSteps = 20000;

nlohmann::ordered_json schedule_json(const Schedule& s, const MemoryModel& mm) {
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  for (const Step& st : s.steps) {
    nlohmann::ordered_json j = {{"id", st.id}, {"kind", to_string(st.kind)}, {"phase", to_string(st.phase)},
                                {"op", st.name}, {"hop", to_string(st.hop)}, {"bytes", st.bytes}, {"flops", st.flops},
                                {"params", st.params}, {"src", to_string(st.src)}, {"dst", to_string(st.dst)},
                                {"link", to_string(st.link)}, {"deps", st.deps}};
    if (st.state) j["state"] = to_string(*st.state);
    if (st.tile >= 0) j["tile"] = st.tile;
    if (st.micro_batch >= 0) j["micro_batch"] = st.micro_batch;
    if (st.accum_step >= 0) j["accum_step"] = st.accum_step;
    if (is_collective(st))
      j["collective"] = {{"kind", to_string(st.collective.kind)}, {"group", to_string(st.collective.group)},
                         {"members", st.collective.members}, {"root", st.collective.root},
                         {"bytes_per_rank", st.collective.bytes_per_rank}};
    for (const auto& [key, ids] : {std::pair{"allocs", &st.allocs}, {"frees", &st.frees}, {"uses", &st.uses}})
      if (!ids->empty()) j[key] = *ids;
    if (st.src_buf >= 0) j["src_buf"] = st.src_buf;
    if (st.dst_buf >= 0) j["dst_buf"] = st.dst_buf;
    steps.push_back(std::move(j));
  }
  nlohmann::ordered_json buffers = nlohmann::ordered_json::array();
  for (const Buffer& b : s.buffers)
    buffers.push_back({{"name", b.name}, {"kind", to_string(b.kind)}, {"tier", to_string(b.tier)}, {"bytes", b.bytes},
                       {"offset", b.offset}, {"arena_bytes", b.arena_bytes}, {"made_at", b.made_at},
                       {"freed_at", b.freed_at}});
  nlohmann::ordered_json peak, cap, traffic, when, arena;
  for (Tier t : {Tier::gpu, Tier::cpu, Tier::nvme}) {
    peak[to_string(t)] = s.peak_bytes[int(t)];
    arena[to_string(t)] = s.arena_bytes[int(t)];
    cap[to_string(t)] = s.capacity_bytes[int(t)];
    when[to_string(t)] = mm.of(t).moment;
  }
  for (int l = 1; l < kLinkClasses; ++l) traffic[to_string(LinkClass(l))] = s.traffic_bytes[l];
  nlohmann::ordered_json j = {{"strategy", s.strategy}, {"rank", s.rank}, {"dp", s.dp}, {"mp", s.mp},
                              {"pp", s.pp}, {"virtual_stages", s.config.virtual_stages}, {"stage", s.stage}, {"grad_accum", s.grad_accum},
                              {"compute_flops", s.compute_flops}, {"peak_bytes", peak}, {"peak_moment", when},
                              {"capacity_bytes", cap},
                              {"traffic_bytes", traffic}, {"fits", !s.overflow.has_value()}};
  if (s.overflow) j["overflow"] = s.overflow->message;
  j["memory_plan"] = {{"arena_bytes", arena}, {"edges", s.memory_edges}, {"buffers", buffers}};
  j["steps"] = steps;
  return j;
}

std::string summary_text(const Schedule& s, const MemoryModel& mm) {
  std::ostringstream o;
  o << "\nrank " << s.rank << " of dp " << s.dp << " (mp " << s.mp
    << (s.pp > 1 ? ", stage " + std::to_string(s.stage) + " of pp " + std::to_string(s.pp) : std::string())
    << (s.config.virtual_stages > 1 ? " interleaved x" + std::to_string(s.config.virtual_stages) : std::string()) << "), " << s.steps.size() << " steps, "
    << format_sig(s.compute_flops / 1e12) << " TFLOP on the GPU\n";
  std::vector<std::vector<std::string>> rows = {
      {"tier", "peak", "buffer arena (plan)", "capacity per rank", "peaks in (memory model)"}};
  for (Tier t : {Tier::gpu, Tier::cpu, Tier::nvme})
    rows.push_back({to_string(t), format_bytes(s.peak_bytes[int(t)]), format_bytes(double(s.arena_bytes[int(t)])),
                    format_bytes(s.capacity_bytes[int(t)]), mm.of(t).moment.empty() ? "-" : mm.of(t).moment});
  o << render_table(rows);
  o << "memory plan: " << s.buffers.size() << " buffers placed at fixed offsets, " << s.memory_edges
    << " dependencies added so that a buffer reusing bytes waits for their last user\n";
  rows = {{"link class", "bytes per iteration"}};
  for (int l = 1; l < kLinkClasses; ++l) rows.push_back({to_string(LinkClass(l)), format_bytes(s.traffic_bytes[l])});
  o << render_table(rows);
  o << (s.overflow ? s.overflow->message : std::string("fits: every tier stays within its capacity")) << "\n";
  return o.str();
}

}  // namespace

Command add_schedule(CLI::App& app) {
  auto f = std::make_shared<ScheduleFlags>();
  CLI::App* sub = app.add_subcommand(
      "schedule",
      "The ZeRO-Infinity schedule of one training iteration for one rank (paper Sec. 5-7): fetches\n"
      "(nc NVMe->CPU, cg CPU->GPU, gg all-gather), computes, releases, gradient reduce/offload,\n"
      "checkpoints and the chunked optimizer, with dependencies; peak bytes per tier; traffic per link.");
  f->profile.add(*sub);
  f->model.add(*sub);
  f->run.add(*sub);
  add_int(*sub, "--rank", f->rank, 0, kMaxGpus - 1, "Which data-parallel rank to print");
  add_int(*sub, "--stage", f->stage, 0, kMaxPp - 1, "With --pp: which pipeline stage to print");
  sub->add_flag("--json", f->json, "JSON: steps (kind, op, bytes, src, dst, deps), peak_bytes, peak_moment, traffic_bytes");
  sub->add_flag("--text", f->text, "Text: one step per line (the default), then the summary");
  sub->add_flag("--full", f->full,
                "Text: list every step also past " + std::to_string(kListedSteps) +
                    " steps (by default only the summary is printed then)");
  sub->add_option("-o,--output", f->output, "Write to this file instead of stdout (atomically)");
  return {sub, [f]() {
            if (f->json && f->text) throw UsageError("--json and --text: give one, not both");
            check_output_file("-o", f->output);
            HardwareProfile p = f->profile.load();
            if (!f->model.given()) throw UsageError("--model: missing (or give --layers, --hidden and --heads)");
            ModelSpec m = f->model.load();
            Placement pl = f->run.placement();
            TrainingConfig c = f->run.training(m, pl, p, /*one_stage=*/true);
            Schedule s = take(build_schedule(m, pl, c, p, f->rank, MemorySizes{}, f->stage));
            std::vector<std::string> bad = check_invariants(s);
            if (!bad.empty()) throw std::logic_error("schedule breaks an invariant: " + bad.front());  // a bug: exit 1
            TrainingConfig resolved = c;
            resolved.dp = s.dp;
            const MemoryModel mm = memory_model(m, pl, resolved, p, f->rank, MemorySizes{}, f->stage);
            std::string out;
            if (f->json) {
              // nlohmann's destructor allocates (a stack for nested values) and aborts when that
              // fails, so a JSON document that cannot fit must be refused before it is built: the
              // probe allocates what the document and its text take (about 2.5 KiB per step, 0.5 KiB
              // per buffer, measured on the paper's models) and throws a clean bad_alloc instead.
              {
                const std::size_t probe = s.steps.size() * 2560 + s.buffers.size() * 512;
                std::unique_ptr<char[]> room(new char[probe]);
                room[probe - 1] = 0;
              }
              out = schedule_json(s, mm).dump(1) + "\n";
            }
            else if (f->full || s.steps.size() <= kListedSteps)
              out = schedule_text(s) + summary_text(s, mm);
            else
              out = "the step list of " + std::to_string(s.steps.size()) + " steps is left out past " +
                    std::to_string(kListedSteps) + " (give --full to print it, or --json)\n" + summary_text(s, mm);
            write_output(f->output, out);
            return s.overflow ? 1 : 0;
          }};
}

}  // namespace memwall::cli
