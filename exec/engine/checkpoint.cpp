#include "exec/engine/checkpoint.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "exec/io/temp_file.hpp"
#include "exec/io/user_files.hpp"

namespace memwall::exec {
namespace {

std::uint64_t fnv1a(const char* p, std::size_t n) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 0x100000001b3ull;
  return h;
}

// Writes `name` in `dir` through `name.tmp` (made new, never through a link), fsync and rename,
// then fsyncs the folder: after a crash the file is either the old one or the whole new one.
Result<bool> write_durably(const io::Folder& dir, const std::string& name, const char* data, std::size_t n) {
  const std::string tmp = name + ".tmp", tmp_path = dir.path() + "/" + tmp;
  const io::TempFileGuard guard(tmp_path);  // gone after the rename; removed on an error or a signal before it
  // a .tmp left by a run killed while saving is ours to replace (the folder is locked: no one else writes it)
  Result<int> made = dir.create_file(tmp, io::Existing::replace, O_WRONLY);
  if (!made) return make_error("write " + made.error());
  const int fd = *made;
  std::size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, data + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string e = w == 0 ? "no progress" : std::strerror(errno);
      ::close(fd);
      return make_error("write " + tmp_path + ": offset " + std::to_string(done) + ": " + e);
    }
    done += std::size_t(w);
  }
  if (::fsync(fd) != 0) {
    const std::string e = std::strerror(errno);
    ::close(fd);
    return make_error("fsync " + tmp_path + ": " + e);
  }
  ::close(fd);
  return dir.replace(tmp, name);
}

// A checkpoint file, read whole: a regular file of at most `max_bytes` (a FIFO or device planted
// in a checkpoint folder is refused, not waited on; O_NONBLOCK so that opening a FIFO returns).
Result<std::vector<char>> read_whole(const std::string& path, std::uint64_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return make_error(path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return make_error(path + ": not a regular file (a folder, device, FIFO or socket), expected a checkpoint file");
  }
  if (std::uint64_t(st.st_size) > max_bytes) {
    ::close(fd);
    return make_error(path + ": " + std::to_string(st.st_size) + " bytes, expected at most " + std::to_string(max_bytes));
  }
  std::vector<char> out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const std::string e = std::strerror(errno);
      ::close(fd);
      return make_error("read " + path + ": offset " + std::to_string(out.size()) + ": " + e);
    }
    if (r == 0) break;
    out.insert(out.end(), buf, buf + r);
    if (out.size() > max_bytes) {  // grew while read
      ::close(fd);
      return make_error(path + ": more than " + std::to_string(max_bytes) + " bytes, expected at most that");
    }
  }
  ::close(fd);
  return out;
}

// What a checkpoint must match to be resumed by a run: the model, placement, dp, mp, pp (and its
// chunks per stage: a stage's units follow them), precision, tiling.
nlohmann::ordered_json identity(const EngineContext& e) {
  nlohmann::ordered_json place = nlohmann::ordered_json::object();
  for (State st : {State::param16, State::grad16, State::optim32})
    place[to_string(st)] = std::string(to_string(e.tier(st))) + (e.o.placement.of(st).partitioned ? "/p" : "");
  place["fetch"] = e.o.placement.fetch == ParamFetch::broadcast ? "broadcast" : "allgather";
  nlohmann::ordered_json id = {{"layers", e.o.model.layers},        {"hidden", e.o.model.hidden},
                                {"heads", e.o.model.heads},          {"seq", e.o.model.max_seq},
                                {"vocab", e.o.model.vocab},          {"dp", e.dp},
                                {"mp", e.mp},                        {"pp", e.pp},
                                {"virtual_stages", e.pp > 1 ? std::max(1, e.o.config.virtual_stages) : 1},
                                {"precision", std::string(adam::dtype_name(e.o.precision))},
                                {"tiling_factor", e.o.config.tiling_factor}, {"placement", place}};
  // the block's kind beyond the paper's GPT (absent for it, so its checkpoints read as before)
  if (const std::string kind = gpt_model_spec(e.o.model).kind_words(); !kind.empty()) id["kind"] = kind;
  if (e.o.model.positions == PositionKind::rotary) id["rope_theta"] = e.o.model.rope_theta;
  return id;
}

}  // namespace

namespace {

// The files of one checkpoint into `step` (made already), then, on rank 0, the manifest and `latest`
// in `top`, and the older steps removed.
Result<bool> write_step(EngineContext& e, const io::Folder& top, const io::Folder& step, const std::string& name,
                        const RunPosition& at) {
  std::vector<std::uint64_t> mine;  // bytes and checksum of this rank's two files
  for (State st : {State::param16, State::optim32}) {
    Result<std::vector<char>> bytes = e.tiers.read_state(st);
    if (!bytes) return make_error("--save: " + bytes.error());
    char file[48];
    std::snprintf(file, sizeof file, "rank%04d.%s", e.world_rank, to_string(st));
    if (Result<bool> w = write_durably(step, file, bytes->data(), bytes->size()); !w) return make_error(w.error());
    mine.push_back(bytes->size());
    mine.push_back(fnv1a(bytes->data(), bytes->size()));
  }
  std::vector<std::vector<std::uint64_t>> all(std::size_t(e.world));
  for (std::uint64_t v : mine) {
    std::vector<std::uint64_t> g = {v};
    if (e.world > 1) {
      Result<std::vector<std::uint64_t>> r = e.everyone()->all_gather_u64(v);
      if (!r) return make_error(r.error());
      g = std::move(r).value();
    }
    for (std::size_t q = 0; q < g.size(); ++q) all[q].push_back(g[q]);
  }
  if (e.o.save_pause_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(e.o.save_pause_s));
  if (e.world_rank != 0) return true;
  nlohmann::ordered_json files = nlohmann::ordered_json::array();
  for (int q = 0; q < e.world; ++q)
    for (int k2 = 0; k2 < 2; ++k2) {
      char file[48];
      std::snprintf(file, sizeof file, "rank%04d.%s", q, k2 == 0 ? "param16" : "optim32");
      files.push_back({{"rank", q}, {"file", file}, {"bytes", all[size_t(q)][size_t(2 * k2)]},
                       {"fnv1a64", all[size_t(q)][size_t(2 * k2 + 1)]}});
    }
  nlohmann::ordered_json m = {{"format", "memwall checkpoint 1"}, {"run", identity(e)},
                              {"iteration", at.iteration},     {"adam_step", e.adam_step},
                              {"data_rng", at.data_rng},       {"files", files}};
  const std::string text = m.dump(1) + "\n";
  if (Result<bool> w = write_durably(step, "manifest.json", text.data(), text.size()); !w) return make_error(w.error());
  const std::string latest = name + "\n";
  if (Result<bool> w = write_durably(top, "latest", latest.data(), latest.size()); !w) return make_error(w.error());
  // keep the newest two (real folders only: a link named step-* is not followed into)
  std::error_code ec;
  std::vector<std::string> steps;
  for (const auto& d : std::filesystem::directory_iterator(top.path(), ec))
    if (d.is_directory() && !d.is_symlink() && d.path().filename().string().rfind("step-", 0) == 0)
      steps.push_back(d.path().string());
  std::sort(steps.begin(), steps.end());
  for (std::size_t i = 0; i + 2 < steps.size(); ++i) std::filesystem::remove_all(steps[i], ec);
  return true;
}

}  // namespace

Result<bool> save_checkpoint(EngineContext& e, const std::string& dir, const RunPosition& at) {
  if (e.dpu_active)
    return make_error("--save " + dir + ": the delayed parameter update holds step " + std::to_string(at.iteration) +
                      "'s gradients until the next step; a checkpoint would lose them (save within --dpu-warmup)");
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", at.iteration);
  Result<io::Folder> top = io::Folder::open(dir, "--save");
  if (!top) return make_error(top.error());
  bool made = false;
  Result<io::Folder> step = make_error("");
  if (e.world_rank == 0) step = top->make_folder(name, &made);
  if (e.world_rank == 0 && !step) return make_error("--save: " + step.error());
  if (e.world > 1)
    if (Result<bool> b = e.everyone()->barrier(); !b) return make_error(b.error());
  if (e.world_rank != 0) step = top->make_folder(name);
  if (!step) return make_error("--save: " + step.error());
  Result<bool> wrote = write_step(e, *top, *step, name, at);
  if (!wrote && made) {  // a failed save leaves no partial step folder behind
    std::error_code ec;
    std::filesystem::remove_all(step->path(), ec);
  }
  if (!wrote) return wrote;
  if (e.world > 1)
    if (Result<bool> b = e.everyone()->barrier(); !b) return make_error(b.error());
  return true;
}

namespace {

// Every field of a manifest the run reads, checked before any is used: types, ranges and the
// consistency of iteration, adam_step and the folder name (issue 30: "iteration": 1e20 resumed at
// step -2147483648 and trained on). Fills `at` and `adam_step`.
Result<bool> check_manifest(const nlohmann::json& m, const std::string& mpath, const std::string& name, RunPosition& at,
                            long& adam_step) {
  auto bad = [&](const std::string& field, const std::string& expected) {
    return make_error(mpath + ": " + field + ": expected " + expected + ", got " +
                      (m.contains(field) ? m[field].dump() : std::string("nothing")));
  };
  constexpr long kMaxIteration = 1000000000;  // --steps' cap
  if (!m.contains("iteration") || !m["iteration"].is_number_integer() || m["iteration"].get<long long>() < 1 ||
      m["iteration"].get<long long>() > kMaxIteration)
    return bad("iteration", "the step it was saved after, an integer from 1 to " + std::to_string(kMaxIteration));
  at.iteration = int(m["iteration"].get<long long>());
  char want[32];
  std::snprintf(want, sizeof want, "step-%08d", at.iteration);
  if (name != want)
    return make_error(mpath + ": iteration: " + std::to_string(at.iteration) + " does not match its folder " + name +
                      " (expected " + want + ")");
  if (!m.contains("adam_step") || !m["adam_step"].is_number_integer() || m["adam_step"].get<long long>() < 0 ||
      m["adam_step"].get<long long>() > at.iteration)
    return bad("adam_step", "the optimizer steps taken, an integer from 0 to the iteration (" +
                                std::to_string(at.iteration) + ")");
  adam_step = long(m["adam_step"].get<long long>());
  if (!m.contains("data_rng") || !m["data_rng"].is_number_unsigned())
    return bad("data_rng", "the data sampler's state, an unsigned 64-bit integer");
  at.data_rng = m["data_rng"].get<std::uint64_t>();
  if (!m.contains("run") || !m["run"].is_object()) return bad("run", "the run's identity (an object)");
  if (!m.contains("files") || !m["files"].is_array()) return bad("files", "a list of files (two per rank)");
  for (const nlohmann::json& f : m["files"])
    if (!f.is_object() || !f.contains("file") || !f["file"].is_string() || !f.contains("bytes") ||
        !f["bytes"].is_number_unsigned() || !f.contains("fnv1a64") || !f["fnv1a64"].is_number_unsigned())
      return make_error(mpath + ": files: expected entries with file (a name), bytes and fnv1a64 (unsigned integers), got " +
                        f.dump());
  return true;
}

}  // namespace

Result<RunPosition> resume_checkpoint(EngineContext& e, const std::string& dir) {
  Result<std::vector<char>> latest = read_whole(dir + "/latest", 4096);
  if (!latest) return make_error("--resume " + dir + ": no checkpoint (" + latest.error() + ")");
  std::string name(latest->begin(), latest->end());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  // a step folder's name and nothing else: "latest" cannot point outside the folder
  if (name.size() != 13 || name.rfind("step-", 0) != 0 || name.find_first_not_of("0123456789", 5) != std::string::npos)
    return make_error(dir + "/latest: expected the name of a step folder (step-NNNNNNNN), got \"" + name.substr(0, 64) + "\"");
  const std::string step_dir = dir + "/" + name, mpath = step_dir + "/manifest.json";
  Result<std::vector<char>> mtext = read_whole(mpath, 64 << 20);
  if (!mtext) return make_error("--resume: " + mtext.error());
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(mtext->begin(), mtext->end());
  } catch (const std::exception& ex) {
    std::string why = ex.what();  // "[json.exception.parse_error.101] parse error at line 1, ...": the part after the tag
    if (why.starts_with("[json.exception.")) why = why.substr(std::min(why.size(), why.find("] ") + 2));
    return make_error(mpath + ": not a memwall checkpoint manifest (not JSON: " + why + ")");
  }
  if (!m.is_object() || !m.contains("format") || m["format"] != "memwall checkpoint 1")
    return make_error(mpath + ": format: expected \"memwall checkpoint 1\"");
  RunPosition at;
  long adam_step = 0;
  if (Result<bool> ok = check_manifest(m, mpath, name, at, adam_step); !ok) return make_error(ok.error());
  const nlohmann::json mine = nlohmann::json::parse(identity(e).dump());
  for (auto it = mine.begin(); it != mine.end(); ++it) {
    // checkpoints from before tensor slicing (pipelines, interleaving) ran have no mp (pp,
    // virtual_stages): they are 1's
    const bool one = it.key() == "mp" || it.key() == "pp" || it.key() == "virtual_stages";
    const nlohmann::json theirs = m["run"].contains(it.key()) ? m["run"][it.key()]
                                  : one                       ? nlohmann::json(1)
                                                              : nlohmann::json();
    if (theirs != it.value())
      return make_error(mpath + ": run." + it.key() + ": the checkpoint has " + theirs.dump() + ", this run " +
                        it.value().dump() + " (resume with the same model, placement, dp, mp, pp, virtual stages, precision and tiling: " +
                        "each rank's files hold its own slice and shard)");
  }
  if (m["files"].size() != std::size_t(2 * e.world))
    return make_error(mpath + ": files: " + std::to_string(m["files"].size()) + " entries, expected two per rank (" +
                      std::to_string(2 * e.world) + ")");
  for (State st : {State::param16, State::optim32}) {
    char file[48];
    std::snprintf(file, sizeof file, "rank%04d.%s", e.world_rank, to_string(st));
    const nlohmann::json* entry = nullptr;
    for (const nlohmann::json& f : m["files"])
      if (f["file"] == file) entry = &f;
    if (!entry) return make_error(mpath + ": files: no entry for " + file);
    const std::uint64_t want = (*entry)["bytes"].get<std::uint64_t>();
    if (want != e.tiers.state_size(st))
      return make_error(mpath + ": files: " + file + ": bytes " + std::to_string(want) + ", this run needs " +
                        std::to_string(e.tiers.state_size(st)));
    Result<std::vector<char>> bytes = read_whole(step_dir + "/" + file, want);
    if (!bytes) return make_error("--resume: " + bytes.error());
    if (bytes->size() != want)
      return make_error(step_dir + "/" + file + ": " + std::to_string(bytes->size()) + " bytes, the manifest says " +
                        std::to_string(want));
    if (fnv1a(bytes->data(), bytes->size()) != (*entry)["fnv1a64"].get<std::uint64_t>())
      return make_error(step_dir + "/" + file + ": checksum differs from the manifest's (the file is damaged)");
    if (Result<bool> w = e.tiers.write_state(st, *bytes); !w) return make_error("--resume: " + w.error());
  }
  e.adam_step = adam_step;
  e.iteration = at.iteration;
  return at;
}

}  // namespace memwall::exec
