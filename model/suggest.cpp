#include "model/suggest.hpp"

#include <algorithm>
#include <utility>

namespace memwall {

std::string lower_ascii(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = char(c - 'A' + 'a');
  return out;
}

int edit_distance(std::string_view a0, std::string_view b0) {
  const std::string a = lower_ascii(a0), b = lower_ascii(b0);
  const std::size_t n = a.size(), m = b.size();
  // three rows: the one before the previous is needed for swaps of neighbours
  std::vector<int> two(m + 1), one(m + 1), cur(m + 1);
  for (std::size_t j = 0; j <= m; ++j) one[j] = int(j);
  for (std::size_t i = 1; i <= n; ++i) {
    cur[0] = int(i);
    for (std::size_t j = 1; j <= m; ++j) {
      const int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      cur[j] = std::min({one[j] + 1, cur[j - 1] + 1, one[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) cur[j] = std::min(cur[j], two[j - 2] + 1);
    }
    std::swap(two, one);
    std::swap(one, cur);
  }
  return one[m];
}

std::vector<std::string> closest_names(std::string_view word, const std::vector<std::string>& candidates,
                                       std::size_t limit) {
  const std::string w = lower_ascii(word);
  const int bound = w.size() <= 4 ? 1 : std::min(4, int(w.size() / 3));
  std::vector<std::pair<int, std::string>> near;
  for (const std::string& c : candidates) {
    const std::string lc = lower_ascii(c);
    int d = edit_distance(w, lc);
    const bool prefix = w.size() >= 3 && (lc.starts_with(w) || w.starts_with(lc));
    if (d <= bound || prefix) near.emplace_back(prefix ? std::min(d, bound) : d, c);
  }
  std::stable_sort(near.begin(), near.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  std::vector<std::string> out;
  for (const auto& [d, c] : near) {
    if (out.size() == limit || d > near.front().first + 1) break;  // not much worse than the best
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  }
  return out;
}

std::string did_you_mean(std::string_view word, const std::vector<std::string>& candidates) {
  const std::vector<std::string> near = closest_names(word, candidates);
  if (near.empty()) return "";
  std::string s = " (did you mean ";
  for (std::size_t i = 0; i < near.size(); ++i)
    s += (i == 0 ? "" : i + 1 == near.size() ? " or " : ", ") + near[i];
  return s + "?)";
}

}  // namespace memwall
