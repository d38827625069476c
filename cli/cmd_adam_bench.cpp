// `memwall adam-bench`: times memwall's CPU Adam (exec/adam) and a STREAM-style triad on this
// machine and reports parameters per second against the memory-bandwidth bound, with the metrics
// of results/METRICS.md ("## CPU Adam"). Parses and prints; exec/adam/adam_bench measures.
#include <algorithm>
#include <cmath>
#include <thread>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/cli_common.hpp"
#include "cli/commands.hpp"
#include "exec/adam/adam_bench.hpp"
#include "exec/adam/cpu_adam.hpp"
#include "model/units.hpp"

namespace memwall::cli {
namespace {

struct AdamBenchFlags {
  std::string params = "100M";
  std::string dtype = "bf16";
  std::string grad = "fp32";
  std::string isa;
  int threads = 0;
  int repeats = 10;
  bool json = false;
};

// Oversubscribing a core 8 times is already pointless for a memory-bound kernel.
long max_threads() { return 8L * std::max(1u, std::thread::hardware_concurrency()); }

adam::AdamBenchOptions to_options(const AdamBenchFlags& f) {
  adam::AdamBenchOptions o;
  Result<double> params = parse_quantity(f.params, Dimension::count);
  if (!params || !(*params >= 1) || *params != std::floor(*params))
    throw UsageError("--params: expected a whole number of parameters >= 1, such as 100M, got \"" + f.params + "\"");
  if (*params > 1e15) throw UsageError("--params: expected at most 1e15 parameters, got \"" + f.params + "\"");
  o.params = static_cast<std::size_t>(*params);
  if (f.dtype != "bf16" && f.dtype != "fp16")
    throw UsageError("--dtype: expected bf16 or fp16, got \"" + f.dtype + "\"");
  o.param16_dtype = take(adam::parse_dtype(f.dtype));
  Result<adam::DType> grad = adam::parse_dtype(f.grad);
  if (!grad) throw UsageError("--grad-dtype: " + grad.error());
  o.grad_dtype = *grad;
  if (!f.isa.empty()) {
    Result<adam::Isa> isa = adam::parse_isa(f.isa);
    if (!isa) throw UsageError("--isa: " + isa.error());
    if (!adam::isa_supported(*isa)) throw UsageError("--isa: this CPU cannot run " + f.isa);
    o.isa = *isa;
  }
  o.threads = f.threads;
  o.repeats = f.repeats;
  return o;
}

std::string text_report(const adam::AdamBenchReport& r) {
  std::ostringstream s;
  s << "memwall adam-bench: " << format_count(static_cast<double>(r.params)) << " params, fp32 state, "
    << adam::dtype_name(r.grad_dtype) << " gradients, " << adam::dtype_name(r.param16_dtype) << " copy, "
    << adam::isa_name(r.isa) << ", " << r.threads << " threads, best of " << r.repeats << "\n\n";
  s << render_table({{"", "time", "rate", "bandwidth", "bytes counted"},
                     {"adam step", format_sig(r.adam_best_s * 1e3) + " ms",
                      format_count(r.params_per_s) + " params/s", format_bandwidth(r.adam_Bps),
                      format_g(r.bytes_per_param) + " B/param"},
                     {"triad a = b + s*c", format_sig(r.triad_best_s * 1e3) + " ms", "",
                      format_bandwidth(r.triad_Bps), format_g(adam::kTriadBytesPerElem) + " B/elem"},
                     {"memory bound", "", format_count(r.memory_bound_params_per_s) + " params/s", "", ""}});
  s << "\nadam reaches " << format_sig(100.0 * r.fraction_of_bound) << " % of the memory-bandwidth bound "
    << "(median step " << format_sig(r.adam_median_s * 1e3) << " ms); definitions: results/METRICS.md\n";
  return s.str();
}

nlohmann::ordered_json json_report(const adam::AdamBenchReport& r) {
  return {{"params", r.params},
          {"param16_dtype", adam::dtype_name(r.param16_dtype)},
          {"grad_dtype", adam::dtype_name(r.grad_dtype)},
          {"isa", adam::isa_name(r.isa)},
          {"threads", r.threads},
          {"repeats", r.repeats},
          {"adam_best_s", r.adam_best_s},
          {"adam_median_s", r.adam_median_s},
          {"params_per_s", r.params_per_s},
          {"bytes_per_param", r.bytes_per_param},
          {"adam_Bps", r.adam_Bps},
          {"triad_bytes_per_elem", adam::kTriadBytesPerElem},
          {"triad_best_s", r.triad_best_s},
          {"triad_Bps", r.triad_Bps},
          {"memory_bound_params_per_s", r.memory_bound_params_per_s},
          {"fraction_of_memory_bound", r.fraction_of_bound}};
}

}  // namespace

Command add_adam_bench(CLI::App& app) {
  auto f = std::make_shared<AdamBenchFlags>();
  CLI::App* sub = app.add_subcommand(
      "adam-bench",
      "Time memwall's CPU Adam (fp32 state, 16-bit copy written in the same pass) and a STREAM-style\n"
      "triad on this machine; report params/s and the memory-bandwidth bound (results/METRICS.md)");
  sub->add_option("--params", f->params, "Parameters updated per step (a count: 100M, 1.5B, 4096)")
      ->capture_default_str();
  sub->add_option("--dtype", f->dtype, "The 16-bit parameter copy written in the same pass: bf16 or fp16")
      ->capture_default_str();
  sub->add_option("--grad-dtype", f->grad, "Gradient type read: fp32, fp16 or bf16")->capture_default_str();
  sub->add_option("--isa", f->isa, "Force a kernel: scalar, avx2 or avx512 (default: the best this CPU runs)");
  add_int(*sub, "--threads", f->threads, 0, max_threads(), "Threads (0 = all cores; at most 8 per core)");
  add_int(*sub, "--repeats", f->repeats, 1, 1000, "Timed steps and triad passes, after one warm-up each; the best is reported");
  sub->add_flag("--json", f->json, "JSON output (params_per_s, bytes_per_param, memory_bound_params_per_s, ...)");
  return {sub, [f]() {
            const adam::AdamBenchOptions o = to_options(*f);
            Result<adam::AdamBenchReport> run = adam::run_adam_bench(o);
            // The library names its fields as the flags are named ("params: ..."); say which flag.
            if (!run) throw UsageError("--" + run.error());
            const adam::AdamBenchReport& r = *run;
            write_output("", f->json ? json_report(r).dump(2) + "\n" : text_report(r));
            return 0;
          }};
}

}  // namespace memwall::cli
