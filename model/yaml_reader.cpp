#include "model/yaml_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <sstream>

#include <yaml-cpp/eventhandler.h>

#include "model/suggest.hpp"

namespace memwall {
namespace {

constexpr int kMaxDepth = 32;
constexpr long kMaxYamlNodes = 100000;

std::string open_failure(const std::string& path, std::string_view what, int err) {
  const std::string w(what);
  switch (err) {
    case ENOENT: return path + ": no such " + w + " file";
    case ENOTDIR: return path + ": no such " + w + " file (a part of the path is not a folder)";
    case ELOOP: return path + ": cannot read the " + w + " file: too many levels of symbolic links (a symlink loop?)";
    case EACCES: return path + ": cannot read the " + w + " file: permission denied";
    case ENAMETOOLONG: return path.substr(0, 64) + "...: cannot read the " + w + " file: file name too long";
    default: return path + ": cannot read the " + w + " file: " + std::strerror(err);
  }
}

// Closes the descriptor on every path out of read_input_file.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

Result<std::string> read_input_file(const std::string& path, std::string_view what, std::size_t max_bytes) {
  const std::string w(what);
  if (path.empty()) return make_error("expected the path of a " + w + " file, got an empty string");
  if (path.find('\0') != std::string::npos) return make_error("expected the path of a " + w + " file, got a NUL byte");
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below as not a file).
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)};
  if (f.fd < 0) return make_error(open_failure(path, what, errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) return make_error(open_failure(path, what, errno));
  if (S_ISDIR(st.st_mode)) return make_error(path + ": is a folder, not a " + w + " file");
  if (!S_ISREG(st.st_mode))
    return make_error(path + ": not a regular file (a device, FIFO or socket), expected a " + w + " file");
  if (st.st_size > 0 && std::uint64_t(st.st_size) > max_bytes)
    return make_error(path + ": " + format_bytes(double(st.st_size)) + ", larger than any " + w + " file (at most " +
                      format_bytes(double(max_bytes)) + ")");
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return make_error(path + ": cannot read the " + w + " file: " + std::strerror(errno));
    if (n == 0) break;
    text.append(buf, std::size_t(n));
    if (text.size() > max_bytes)  // files that report size 0 (/proc) and grow while read
      return make_error(path + ": larger than any " + w + " file (at most " + format_bytes(double(max_bytes)) + ")");
  }
  return text;
}

std::string yaml_scalar(std::string_view s) {
  auto plain = [](unsigned char c) {
    return std::isalnum(c) || std::string_view("_.-+/()@,=").find(char(c)) != std::string_view::npos;
  };
  bool safe = !s.empty() && (std::isalnum(static_cast<unsigned char>(s.front())) || s.front() == '_' || s.front() == '/');
  for (char ch : s) safe = safe && plain(static_cast<unsigned char>(ch));
  if (safe) return std::string(s);
  std::string out = "\"";
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') out += '\\', out += ch;
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      const char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else out += ch;
  }
  return out + "\"";
}

namespace {

// What a document holds: whether it is more than an empty one (a trailing `---`) and where it
// starts. Never YAML::LoadAll: yaml-cpp 0.7 loops forever there on input its parser
// cannot advance past (`a: 1\n---\n,`), pushing null documents until memory runs out (yaml-cpp
// pull request 1319); line_after_first_document reads two at most.
class DocumentProbe final : public YAML::EventHandler {
 public:
  bool holds_something = false;
  YAML::Mark mark = YAML::Mark::null_mark();

  void OnDocumentStart(const YAML::Mark&) override {}
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& m, YAML::anchor_t) override { at(m, false); }
  void OnAlias(const YAML::Mark& m, YAML::anchor_t) override { at(m, true); }
  void OnScalar(const YAML::Mark& m, const std::string&, YAML::anchor_t, const std::string&) override { at(m, true); }
  void OnSequenceStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    at(m, true);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& m, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {
    at(m, true);
  }
  void OnMapEnd() override {}

 private:
  void at(const YAML::Mark& m, bool content) {
    if (mark.is_null()) mark = m;
    holds_something = holds_something || content;
  }
};

// The line (1-based) where something follows the first document, or 0 when nothing does but an
// empty document. Two documents are read at most, whatever the input.
int line_after_first_document(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentProbe first;  // YAML::Load has read it already
  if (!parser.HandleNextDocument(first) || !parser) return 0;
  DocumentProbe second;
  if (!parser.HandleNextDocument(second)) return 0;
  if (!second.holds_something && !parser) return 0;  // a trailing `---` and nothing after it
  // Content, or a null document the parser stopped in without consuming what follows it.
  return second.mark.is_null() ? 1 : second.mark.line + 1;
}

}  // namespace

YamlReader::YamlReader(std::string source, std::string_view text) : source_(std::move(source)) {
  try {
    const std::string all(text);
    root_ = YAML::Load(all);
    if (!root_.IsMap()) throw InputError(source_ + ":1: expected a YAML mapping at the top level");
    // A second document (a file of profiles joined with `---`) is refused rather than silently
    // dropped: YAML::Load reads the first and ignores the rest.
    if (const int line = line_after_first_document(all); line > 0)
      throw InputError(source_ + ":" + std::to_string(line) +
                       ": a second document after the first (after `---`, or text after JSON's closing brace); expected one document per file");
  } catch (const YAML::ParserException& e) {
    throw InputError(source_ + ":" + std::to_string(e.mark.line + 1) + ": malformed YAML: " + e.msg);
  } catch (const YAML::Exception& e) {
    throw InputError(source_ + ": malformed YAML: " + e.msg);
  }
  long nodes = 0;
  check_tree(root_, "", 0, nodes);
}

void YamlReader::check_tree(const YAML::Node& node, const std::string& path, int depth, long& nodes) const {
  if (++nodes > kMaxYamlNodes) fail(node, path, "more than " + std::to_string(kMaxYamlNodes) + " YAML nodes (aliases?)");
  if (depth > kMaxDepth) fail(node, path, "nested deeper than " + std::to_string(kMaxDepth) + " levels");
  if (node.IsSequence()) {
    for (std::size_t i = 0; i < node.size(); ++i)
      check_tree(node[i], path + "[" + std::to_string(i) + "]", depth + 1, nodes);
  } else if (node.IsMap()) {
    std::map<std::string, int> seen;  // key -> line of its first occurrence
    for (const auto& kv : node) {
      if (!kv.first.IsScalar())
        fail(kv.first, path.empty() ? "key" : path, "expected a field name, got a YAML mapping or list as a key");
      const std::string key = kv.first.Scalar();
      const int line = kv.first.Mark().line + 1;
      if (auto [it, fresh] = seen.emplace(key, line); !fresh)
        fail(kv.first, join(path, key), "given twice (first at line " + std::to_string(it->second) + ")");
      check_tree(kv.second, join(path, key), depth + 1, nodes);
    }
  }
}

std::string YamlReader::join(const std::string& path, const std::string& key) {
  return path.empty() ? key : path + "." + key;
}

void YamlReader::fail(const YAML::Node& node, const std::string& field, const std::string& what) const {
  std::string where = source_;
  if (node.IsDefined() && node.Mark().line >= 0) where += ":" + std::to_string(node.Mark().line + 1);
  std::string message = where + ": " + (field.empty() ? "" : field + ": ") + what;
  for (char& c : message)  // one line, whatever the input held
    if (c == '\n' || c == '\r') c = ' ';
  throw InputError(message);
}

void YamlReader::only_keys(const YAML::Node& map, const std::string& path,
                           std::initializer_list<std::string_view> known) const {
  only_keys(map, path, std::vector<std::string>(known.begin(), known.end()));
}

void YamlReader::only_keys(const YAML::Node& map, const std::string& path, const std::vector<std::string>& known) const {
  for (const auto& kv : map) {
    std::string key = kv.first.Scalar();  // check_tree made every key a scalar
    bool found = false;
    for (const auto& k : known) found = found || k == key;
    if (found) continue;
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    std::string near = did_you_mean(key, known);
    near = near.empty() ? " (" : near.substr(0, near.size() - 1) + "; ";
    fail(kv.first, join(path, key), "unknown field" + near + "expected one of: " + list + ")");
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
  if (!std::isnormal(*v)) fail(n, join(path, key), "expected a positive value, got \"" + n.Scalar() + "\" (too small to compute with)");
  const QuantityRange range = quantity_range(d);
  if (*v < range.min)
    fail(n, join(path, key), "expected at least " + format_quantity(range.min, d) + ", got \"" + n.Scalar() + "\"");
  if (*v > range.max)
    fail(n, join(path, key), "expected at most " + format_quantity(range.max, d) + ", got \"" + n.Scalar() + "\"");
  return *v;
}

double YamlReader::quantity_or(const YAML::Node& map, const std::string& path, const std::string& key, Dimension d,
                               double fallback) const {
  YAML::Node n = map[key];
  if (!n.IsDefined() || n.IsNull()) return fallback;
  return quantity(map, path, key, d);
}

long YamlReader::integer(const YAML::Node& map, const std::string& path, const std::string& key, long min_value,
                         long max_value) const {
  const std::string expected =
      "an integer from " + std::to_string(min_value) + " to " + std::to_string(max_value);
  YAML::Node n = required(map, path, key, expected);
  if (!n.IsScalar()) fail(n, join(path, key), "expected " + expected);
  const std::string& s = n.Scalar();
  long value = 0;
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  if (ec != std::errc() || end != s.data() + s.size() || s.empty() || value < min_value || value > max_value)
    fail(n, join(path, key), "expected " + expected + ", got \"" + s + "\"");
  return value;
}

long YamlReader::integer_or(const YAML::Node& map, const std::string& path, const std::string& key, long min_value,
                            long max_value, long fallback) const {
  YAML::Node n = map[key];
  if (!n.IsDefined() || n.IsNull()) return fallback;
  return integer(map, path, key, min_value, max_value);
}

long YamlReader::integer_or(const YAML::Node& map, const std::string& path, const std::string& key, long min_value,
                            long fallback) const {
  return integer_or(map, path, key, min_value, std::numeric_limits<long>::max(), fallback);
}

double YamlReader::positive_number(const YAML::Node& map, const std::string& path, const std::string& key,
                                   double max_value) const {
  const std::string expected = "a number > 0 and at most " + format_g(max_value);
  YAML::Node n = required(map, path, key, expected);
  if (!n.IsScalar()) fail(n, join(path, key), "expected " + expected);
  Result<double> v = parse_quantity(n.Scalar(), Dimension::count);
  if (!v || !(*v > 0) || *v > max_value) fail(n, join(path, key), "expected " + expected + ", got \"" + n.Scalar() + "\"");
  if (!std::isnormal(*v)) fail(n, join(path, key), "expected " + expected + ", got \"" + n.Scalar() + "\" (too small to compute with)");
  return *v;
}

double YamlReader::positive_number_or(const YAML::Node& map, const std::string& path, const std::string& key,
                                      double max_value, double fallback) const {
  YAML::Node n = map[key];
  if (!n.IsDefined() || n.IsNull()) return fallback;
  return positive_number(map, path, key, max_value);
}

std::uint64_t YamlReader::bytes_or(const YAML::Node& map, const std::string& path, const std::string& key,
                                   std::uint64_t min_bytes, std::uint64_t max_bytes, std::uint64_t fallback) const {
  YAML::Node n = map[key];
  if (!n.IsDefined() || n.IsNull()) return fallback;
  const std::string expected = "a whole number of bytes from " + format_bytes(double(min_bytes)) + " to " +
                               format_bytes(double(max_bytes)) + ", such as 48 MiB";
  if (!n.IsScalar()) fail(n, join(path, key), "expected " + expected);
  Result<double> v = parse_quantity(n.Scalar(), Dimension::bytes);
  if (!v) fail(n, join(path, key), v.error());
  if (*v < double(min_bytes) || *v > double(max_bytes) || *v != std::floor(*v))
    fail(n, join(path, key), "expected " + expected + ", got \"" + n.Scalar() + "\"");
  return std::uint64_t(*v);
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

bool YamlReader::boolean_or(const YAML::Node& map, const std::string& path, const std::string& key,
                            bool fallback) const {
  YAML::Node n = map[key];
  if (!n.IsDefined() || n.IsNull()) return fallback;
  if (n.IsScalar() && n.Scalar() == "true") return true;
  if (n.IsScalar() && n.Scalar() == "false") return false;
  fail(n, join(path, key), "expected true or false, got \"" + (n.IsScalar() ? n.Scalar() : std::string("a mapping or list")) + "\"");
}

}  // namespace memwall
