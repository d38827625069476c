// libFuzzer target: placement YAML (parse_placement). An accepted placement passes validate().
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "model/placement.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace memwall;
  Result<Placement> r = parse_placement(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.yaml");
  if (fuzz::refused_in_one_line(r)) return 0;
  if (!validate(*r)) memwall::fuzz::fail("accepted an invalid placement", r->name);
  return 0;
}
