// libFuzzer target: model spec YAML (parse_model_spec). Accepted models satisfy the catalogue's
// ranges and hidden % heads == 0 (and kv_heads | heads, the MoE fields together), so nothing
// downstream divides by zero or overflows: the generalised quantities stay finite.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "model/analysis.hpp"
#include "model/model_spec.hpp"
#include "model/units.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace memwall;
  Result<ModelSpec> r = parse_model_spec(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.yaml");
  if (fuzz::refused_in_one_line(r)) return 0;
  const ModelSpec& m = *r;
  fuzz::finite_positive(params_eq1(m.layers, m.hidden), "params");
  fuzz::finite_positive(awm_bytes_eq5(1, m.seq, 1, m.hidden, m.heads), "awm");
  fuzz::check_model_kind(m);
  return 0;
}
