// "Did you mean": the known names closest to a misspelled one. One place for every lookup that
// refuses a name (models, profiles, placement presets, YAML fields, command-line flags), so they
// all suggest the same way. Case is ignored when comparing.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace memwall {

// Edit distance (insertions, deletions, substitutions and swaps of neighbours), ignoring case.
int edit_distance(std::string_view a, std::string_view b);

// The candidates within a distance that grows with the word's length (1 up to 4 letters, then a
// third of them, at most 4), closest first; a candidate that starts with the word or that the
// word starts with (such as "llama" for "llama-3-8b") counts as close too. At most `limit`, none
// more than one edit worse than the closest.
std::vector<std::string> closest_names(std::string_view word, const std::vector<std::string>& candidates,
                                       std::size_t limit = 3);

// " (did you mean a, b or c?)", or "" when nothing is close.
std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates);

// Lower case of ASCII letters (names here are ASCII).
std::string lower_ascii(std::string_view s);

}  // namespace memwall
