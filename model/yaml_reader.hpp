// YamlReader: typed, validated reads from a yaml-cpp document, with errors that name the file,
// the line and the dotted field path ("dgx2.yaml:14: links.gpu_gpu: expected ...").
// Used by every loader (profiles, model specs, placements, plans, run configs): the one place where
// input numbers are range-checked before a loader narrows them, and where files are read
// (read_input_file). Throws InputError, which the loaders catch at their boundary and return as
// Result; nothing escapes model/ as an exception. Not thread-safe per instance; one per file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "model/result.hpp"
#include "model/units.hpp"

namespace memwall {

class InputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Input files are small: a profile is ~40 lines. Anything larger is not one of memwall's files.
inline constexpr std::size_t kMaxInputFileBytes = 1 << 20;

// Reads a whole input file. `what` names the kind of file in messages ("profile", "plan"). One
// line for every way it can fail: "<path>: no such <what> file", "<path>: is a folder, not a
// <what> file", "<path>: cannot read the <what> file: permission denied" (also for a file under an
// unreadable folder), "...: too many levels of symbolic links", a special file (/dev/zero, a FIFO:
// never blocks), a read error (/proc/self/mem), or more than `max_bytes`.
Result<std::string> read_input_file(const std::string& path, std::string_view what,
                                    std::size_t max_bytes = kMaxInputFileBytes);

// `s` as a YAML scalar that reads back as `s`: plain when only letters, digits and _.-+/()@,=
// make it up (a letter, digit, _ or / first), else double-quoted with \\, \" and control characters
// escaped (a model named "a: b #c" broke the plan file it was written to).
std::string yaml_scalar(std::string_view s);

class YamlReader {
 public:
  // Parses `text`; `source` is the file name used in messages. Throws InputError on bad YAML, a
  // top level that is not a mapping, a key that is not a plain string, a key given twice in one
  // mapping, or a document deeper than 32 levels or larger than 100000 nodes (alias bombs).
  YamlReader(std::string source, std::string_view text);

  const YAML::Node& root() const { return root_; }
  const std::string& source() const { return source_; }

  // Rejects keys of `map` not in `known`, naming the first unknown one and listing the known ones.
  void only_keys(const YAML::Node& map, const std::string& path, std::initializer_list<std::string_view> known) const;
  void only_keys(const YAML::Node& map, const std::string& path, const std::vector<std::string>& known) const;

  // Child `key` of `map` that must exist and be a mapping.
  YAML::Node section(const YAML::Node& map, const std::string& path, const std::string& key) const;

  // Required fields (missing -> error naming the field).
  // A quantity with a unit, > 0 and within quantity_range(d) (so it stays finite in any formula).
  double quantity(const YAML::Node& map, const std::string& path, const std::string& key, Dimension d) const;
  // A decimal integer in [min_value, max_value]: "1e9", "4.0", "0x10" and out-of-range values are
  // errors that state the range. Callers narrow the result to the type the range fits.
  long integer(const YAML::Node& map, const std::string& path, const std::string& key, long min_value,
               long max_value) const;
  // A plain number (count suffixes allowed: 1.25, 100M) > 0 and <= max_value.
  double positive_number(const YAML::Node& map, const std::string& path, const std::string& key,
                         double max_value) const;
  long hidden(const YAML::Node& map, const std::string& path, const std::string& key) const;
  std::string text(const YAML::Node& map, const std::string& path, const std::string& key) const;

  // Optional fields: return `fallback` when absent.
  double quantity_or(const YAML::Node& map, const std::string& path, const std::string& key, Dimension d,
                     double fallback) const;
  long integer_or(const YAML::Node& map, const std::string& path, const std::string& key, long min_value,
                  long max_value, long fallback) const;
  double positive_number_or(const YAML::Node& map, const std::string& path, const std::string& key,
                            double max_value, double fallback) const;
  // A whole number of bytes with a unit ("48 MiB") in [min_bytes, max_bytes]: "0.5 B" and
  // "1e30 GiB" are errors, never rounded or replaced.
  std::uint64_t bytes_or(const YAML::Node& map, const std::string& path, const std::string& key,
                         std::uint64_t min_bytes, std::uint64_t max_bytes, std::uint64_t fallback) const;
  std::string text_or(const YAML::Node& map, const std::string& path, const std::string& key,
                      std::string fallback) const;
  // Transitional, for the committed exec/engine/run_config.cpp, which checks its own maximum: up to
  // LONG_MAX. Goes once every caller passes a maximum.
  long integer_or(const YAML::Node& map, const std::string& path, const std::string& key, long min_value,
                  long fallback) const;
  bool boolean_or(const YAML::Node& map, const std::string& path, const std::string& key, bool fallback) const;

  // Throws InputError "<source>:<line>: <field>: <what>" at `node`'s position.
  [[noreturn]] void fail(const YAML::Node& node, const std::string& field, const std::string& what) const;

  // Joins a dotted path: join("links", "gpu_gpu") == "links.gpu_gpu".
  static std::string join(const std::string& path, const std::string& key);

 private:
  YAML::Node required(const YAML::Node& map, const std::string& path, const std::string& key,
                      std::string_view expected) const;
  void check_tree(const YAML::Node& node, const std::string& path, int depth, long& nodes) const;

  std::string source_;
  YAML::Node root_;
};

}  // namespace memwall
