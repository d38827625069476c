// YamlReader: typed, validated reads from a yaml-cpp document, with errors that name the file,
// the line and the dotted field path ("dgx2.yaml:14: links.gpu_gpu: expected ...").
// Used by every loader in model/ (profiles, model specs, configs). Throws InputError, which the
// loaders catch at their boundary and return as Result; nothing escapes model/ as an exception.
// Not thread-safe per instance; make one per file being read.
#pragma once

#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>

#include <yaml-cpp/yaml.h>

#include "model/units.hpp"

namespace memwall {

class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class YamlReader {
 public:
  // Parses `text`; `source` is the file name used in messages. Throws InputError on bad YAML.
  YamlReader(std::string source, std::string_view text);

  const YAML::Node& root() const { return root_; }
  const std::string& source() const { return source_; }

  // Rejects keys of `map` not in `known`, naming the first unknown one and listing the known ones.
  void only_keys(const YAML::Node& map, const std::string& path, std::initializer_list<std::string_view> known) const;

  // Child `key` of `map` that must exist and be a mapping.
  YAML::Node section(const YAML::Node& map, const std::string& path, const std::string& key) const;

  // Required fields (missing -> error naming the field).
  double quantity(const YAML::Node& map, const std::string& path, const std::string& key, Dimension d) const;
  long integer(const YAML::Node& map, const std::string& path, const std::string& key, long min_value) const;
  long hidden(const YAML::Node& map, const std::string& path, const std::string& key) const;
  std::string text(const YAML::Node& map, const std::string& path, const std::string& key) const;

  // Optional fields: return `fallback` when absent.
  double quantity_or(const YAML::Node& map, const std::string& path, const std::string& key, Dimension d,
                     double fallback) const;
  long integer_or(const YAML::Node& map, const std::string& path, const std::string& key, long min_value,
                  long fallback) const;
  std::string text_or(const YAML::Node& map, const std::string& path, const std::string& key,
                      std::string fallback) const;

  // Throws InputError "<source>:<line>: <field>: <what>" at `node`'s position.
  [[noreturn]] void fail(const YAML::Node& node, const std::string& field, const std::string& what) const;

  // Joins a dotted path: join("links", "gpu_gpu") == "links.gpu_gpu".
  static std::string join(const std::string& path, const std::string& key);

 private:
  YAML::Node required(const YAML::Node& map, const std::string& path, const std::string& key,
                      std::string_view expected) const;

  std::string source_;
  YAML::Node root_;
};

}  // namespace memwall
