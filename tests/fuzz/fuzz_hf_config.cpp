// libFuzzer target: Hugging Face config.json (parse_hf_config). An accepted config is a model of
// one of the supported kinds whose fields agree and whose derived quantities are finite; anything
// else is refused in one line naming the field.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "model/model_spec.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace memwall;
  Result<ModelSpec> r = parse_hf_config(std::string_view(reinterpret_cast<const char*>(data), size), "config.json");
  if (fuzz::refused_in_one_line(r)) return 0;
  const ModelSpec& m = *r;
  fuzz::check_model_kind(m);
  return 0;
}
