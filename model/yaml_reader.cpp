#include "model/yaml_reader.hpp"

#include <charconv>

namespace memwall {

YamlReader::YamlReader(std::string source, std::string_view text) : source_(std::move(source)) {
  try {
    root_ = YAML::Load(std::string(text));
  } catch (const YAML::ParserException& e) {
    throw InputError(source_ + ":" + std::to_string(e.mark.line + 1) + ": malformed YAML: " + e.msg);
  }
  if (!root_.IsMap()) throw InputError(source_ + ":1: expected a YAML mapping at the top level");
}

std::string YamlReader::join(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

void YamlReader::fail(const YAML::Node& node, const std::string& field, const std::string& what) const {
  std::string where = source_;
  if (node.IsDefined() && node.Mark().line >= 0) where += ":" + std::to_string(node.Mark().line + 1);
  throw InputError(where + ": " + (field.empty() ? "" : field + ": ") + what);
}

void YamlReader::only_keys(const YAML::Node& map, const std::string& path,
                           std::initializer_list<std::string_view> known) const {
  for (const auto& kv : map) {
    std::string key = kv.first.as<std::string>();
    bool found = false;
    for (auto k : known) found = found || k == key;
    if (found) continue;
    std::string list;
    for (auto k : known) list += (list.empty() ? "" : ", ") + std::string(k);
    fail(kv.first, join(path, key), "unknown field (expected one of: " + list + ")");
  }
}

YAML::Node YamlReader::required(const YAML::Node& map, const std::string& path, const std::string& key,
                                std::string_view expected) const {
  YAML::Node n = map[key];
  if (!n.IsDefined() || n.IsNull()) fail(map, join(path, key), "missing field (expected " + std::string(expected) + ")");
  return n;
}

YAML::Node YamlReader::section(const YAML::Node& map, const std::string& path, const std::string& key) const {
  YAML::Node n = required(map, path, key, "a mapping");
  if (!n.IsMap()) fail(n, join(path, key), "expected a mapping of fields");
  return n;
}

double YamlReader::quantity(const YAML::Node& map, const std::string& path, const std::string& key,
                            Dimension d) const {
  YAML::Node n = required(map, path, key, dimension_example(d));
  if (!n.IsScalar()) fail(n, join(path, key), "expected " + std::string(dimension_example(d)));
  Result<double> v = parse_quantity(n.Scalar(), d);
  if (!v) fail(n, join(path, key), v.error());
  if (*v <= 0) fail(n, join(path, key), "expected a positive value, got \"" + n.Scalar() + "\"");
  return *v;
}

double YamlReader::quantity_or(const YAML::Node& map, const std::string& path, const std::string& key, Dimension d,
                               double fallback) const {
  YAML::Node n = map[key];
  if (!n.IsDefined() || n.IsNull()) return fallback;
  return quantity(map, path, key, d);
}

long YamlReader::integer(const YAML::Node& map, const std::string& path, const std::string& key,
                         long min_value) const {
  std::string expected = "an integer >= " + std::to_string(min_value);
  YAML::Node n = required(map, path, key, expected);
  long value = 0;
  const std::string& s = n.IsScalar() ? n.Scalar() : std::string();
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (!n.IsScalar() || ec != std::errc() || end != s.data() + s.size() || value < min_value)
    fail(n, join(path, key), "expected " + expected + ", got \"" + s + "\"");
  return value;
}

long YamlReader::integer_or(const YAML::Node& map, const std::string& path, const std::string& key, long min_value,
                            long fallback) const {
  YAML::Node n = map[key];
  if (!n.IsDefined() || n.IsNull()) return fallback;
  return integer(map, path, key, min_value);
}

long YamlReader::hidden(const YAML::Node& map, const std::string& path, const std::string& key) const {
  YAML::Node n = required(map, path, key, "a hidden size such as 4096 or 64K");
  if (!n.IsScalar()) fail(n, join(path, key), "expected a hidden size such as 4096 or 64K");
  Result<long> v = parse_hidden(n.Scalar());
  if (!v) fail(n, join(path, key), v.error());
  return *v;
}

std::string YamlReader::text(const YAML::Node& map, const std::string& path, const std::string& key) const {
  YAML::Node n = required(map, path, key, "a string");
  if (!n.IsScalar()) fail(n, join(path, key), "expected a string");
  return n.Scalar();
}

std::string YamlReader::text_or(const YAML::Node& map, const std::string& path, const std::string& key,
                                std::string fallback) const {
  YAML::Node n = map[key];
  if (!n.IsDefined() || n.IsNull()) return fallback;
  return text(map, path, key);
}

}  // namespace memwall
