// libFuzzer target: plan YAML (parse_plan), alone and cross-checked against the DGX-2 profile. An
// accepted plan's training config validates against its model, and its DeepSpeed export either
// works or says why in one line.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "model/training_config.hpp"
#include "planner/deepspeed.hpp"
#include "planner/plan_file.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace memwall;
  static const HardwareProfile dgx2 = *load_profile("dgx2");
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  for (const HardwareProfile* p : {static_cast<const HardwareProfile*>(nullptr), &dgx2}) {
    Result<planner::Plan> r = planner::parse_plan(text, "fuzz.yaml", p);
    if (fuzz::refused_in_one_line(r)) continue;
    if (!validate(r->candidate.config, r->model.layers)) fuzz::fail("accepted a config validate() refuses", "");
    fuzz::refused_in_one_line(planner::deepspeed_export(r->model, r->candidate));
    if (p) fuzz::refused_in_one_line(fit_to_profile(r->candidate.config, *p));
  }
  return 0;
}
