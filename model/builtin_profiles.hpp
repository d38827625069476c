// The hardware_profiles/*.yaml files, compiled into the binary so `memwall` works from any
// directory. The .cpp is generated at build time by cmake/embed_profiles.cmake; edit the YAML.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace memwall {

// The YAML text of the embedded profile `name` ("dgx2"), or nullopt.
std::optional<std::string_view> builtin_profile_yaml(std::string_view name);

}  // namespace memwall
