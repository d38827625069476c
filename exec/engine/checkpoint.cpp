#include "exec/engine/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>

#include "exec/io/temp_file.hpp"

namespace memwall::exec {
namespace {

std::uint64_t fnv1a(const char* p, std::size_t n) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 0x100000001b3ull;
  return h;
}

// Writes `path` through `path.tmp`, fsync and rename, then fsyncs the folder: after a crash the
// file is either the old one or the whole new one.
Result<bool> write_durably(const std::string& path, const char* data, std::size_t n) {
  const std::string tmp = path + ".tmp";
  const io::TempFileGuard guard(tmp);  // gone after the rename; removed on an error or a signal before it
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return make_error("write " + tmp + ": " + std::strerror(errno));
  std::size_t done = 0;
  while (done < n) {
    const ssize_t w = ::write(fd, data + done, n - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const std::string e = std::strerror(errno);
      ::close(fd);
      return make_error("write " + tmp + ": offset " + std::to_string(done) + ": " + e);
    }
    done += std::size_t(w);
  }
  if (::fsync(fd) != 0) {
    const std::string e = std::strerror(errno);
    ::close(fd);
    return make_error("fsync " + tmp + ": " + e);
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return make_error("rename " + tmp + " -> " + path + ": " + std::strerror(errno));
  const std::string folder = std::filesystem::path(path).parent_path().string();
  if (const int d = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); d >= 0) {
    ::fsync(d);
    ::close(d);
  }
  return true;
}

Result<std::vector<char>> read_whole(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(path + ": " + std::strerror(errno));
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
  }
  ::close(fd);
  return out;
}

// What a checkpoint must match to be resumed by a run: the model, placement, dp, precision, tiling.
nlohmann::ordered_json identity(const EngineContext& e) {
  nlohmann::ordered_json place = nlohmann::ordered_json::object();
  for (State st : {State::param16, State::grad16, State::optim32})
    place[to_string(st)] = std::string(to_string(e.tier(st))) + (e.o.placement.of(st).partitioned ? "/p" : "");
  place["fetch"] = e.o.placement.fetch == ParamFetch::broadcast ? "broadcast" : "allgather";
  return {{"layers", e.o.model.layers},        {"hidden", e.o.model.hidden},      {"heads", e.o.model.heads},
          {"seq", e.o.model.max_seq},          {"vocab", e.o.model.vocab},        {"dp", e.dp},
          {"precision", std::string(adam::dtype_name(e.o.precision))},
          {"tiling_factor", e.o.config.tiling_factor}, {"placement", place}};
}

}  // namespace

Result<bool> save_checkpoint(EngineContext& e, const std::string& dir, const RunPosition& at) {
  if (e.dpu_active)
    return make_error("--save " + dir + ": the delayed parameter update holds step " + std::to_string(at.iteration) +
                      "'s gradients until the next step; a checkpoint would lose them (save within --dpu-warmup)");
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", at.iteration);
  const std::string step_dir = dir + "/" + name;
  std::error_code ec;
  if (e.rank == 0) {
    std::filesystem::create_directories(step_dir, ec);
    if (ec) return make_error("--save " + dir + ": cannot create " + step_dir + ": " + ec.message());
  }
  if (e.dp > 1)
    if (Result<bool> b = e.coll->barrier(); !b) return make_error(b.error());
  std::vector<std::uint64_t> mine;  // bytes and checksum of this rank's two files
  for (State st : {State::param16, State::optim32}) {
    Result<std::vector<char>> bytes = e.tiers.read_state(st);
    if (!bytes) return make_error("--save: " + bytes.error());
    char file[48];
    std::snprintf(file, sizeof file, "/rank%04d.%s", e.rank, to_string(st));
    if (Result<bool> w = write_durably(step_dir + file, bytes->data(), bytes->size()); !w) return make_error(w.error());
    mine.push_back(bytes->size());
    mine.push_back(fnv1a(bytes->data(), bytes->size()));
  }
  std::vector<std::vector<std::uint64_t>> all(std::size_t(e.dp));
  for (std::uint64_t v : mine) {
    std::vector<std::uint64_t> g = {v};
    if (e.dp > 1) {
      Result<std::vector<std::uint64_t>> r = e.coll->all_gather_u64(v);
      if (!r) return make_error(r.error());
      g = std::move(r).value();
    }
    for (std::size_t q = 0; q < g.size(); ++q) all[q].push_back(g[q]);
  }
  if (e.o.save_pause_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(e.o.save_pause_s));
  if (e.rank == 0) {
    nlohmann::ordered_json files = nlohmann::ordered_json::array();
    for (int q = 0; q < e.dp; ++q)
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
    if (Result<bool> w = write_durably(step_dir + "/manifest.json", text.data(), text.size()); !w)
      return make_error(w.error());
    const std::string latest = std::string(name) + "\n";
    if (Result<bool> w = write_durably(dir + "/latest", latest.data(), latest.size()); !w) return make_error(w.error());
    // keep the newest two
    std::vector<std::string> steps;
    for (const auto& d : std::filesystem::directory_iterator(dir, ec))
      if (d.is_directory() && d.path().filename().string().rfind("step-", 0) == 0) steps.push_back(d.path().string());
    std::sort(steps.begin(), steps.end());
    for (std::size_t i = 0; i + 2 < steps.size(); ++i) std::filesystem::remove_all(steps[i], ec);
  }
  if (e.dp > 1)
    if (Result<bool> b = e.coll->barrier(); !b) return make_error(b.error());
  return true;
}

Result<RunPosition> resume_checkpoint(EngineContext& e, const std::string& dir) {
  Result<std::vector<char>> latest = read_whole(dir + "/latest");
  if (!latest) return make_error("--resume " + dir + ": no checkpoint (" + latest.error() + ")");
  std::string name(latest->begin(), latest->end());
  while (!name.empty() && (name.back() == '\n' || name.back() == ' ')) name.pop_back();
  const std::string step_dir = dir + "/" + name, mpath = step_dir + "/manifest.json";
  Result<std::vector<char>> mtext = read_whole(mpath);
  if (!mtext) return make_error("--resume: " + mtext.error());
  nlohmann::json m;
  try {
    m = nlohmann::json::parse(mtext->begin(), mtext->end());
  } catch (const std::exception& ex) {
    return make_error(mpath + ": not a memwall checkpoint manifest: " + ex.what());
  }
  if (!m.is_object() || m.value("format", "") != "memwall checkpoint 1")
    return make_error(mpath + ": format: expected \"memwall checkpoint 1\"");
  const nlohmann::json mine = nlohmann::json::parse(identity(e).dump());
  for (auto it = mine.begin(); it != mine.end(); ++it) {
    const nlohmann::json& theirs = m["run"][it.key()];
    if (theirs != it.value())
      return make_error(mpath + ": run." + it.key() + ": the checkpoint has " + theirs.dump() + ", this run " +
                        it.value().dump() + " (resume with the same model, placement, dp, precision and tiling)");
  }
  for (State st : {State::param16, State::optim32}) {
    char file[48];
    std::snprintf(file, sizeof file, "rank%04d.%s", e.rank, to_string(st));
    const nlohmann::json* entry = nullptr;
    for (const nlohmann::json& f : m["files"])
      if (f.value("file", "") == file) entry = &f;
    if (!entry) return make_error(mpath + ": files: no entry for " + file);
    Result<std::vector<char>> bytes = read_whole(step_dir + "/" + file);
    if (!bytes) return make_error("--resume: " + bytes.error());
    const std::uint64_t want = (*entry)["bytes"].get<std::uint64_t>();
    if (bytes->size() != want || want != e.tiers.state_size(st))
      return make_error(step_dir + "/" + file + ": " + std::to_string(bytes->size()) + " bytes, the manifest says " +
                        std::to_string(want) + " and this run needs " + std::to_string(e.tiers.state_size(st)));
    if (fnv1a(bytes->data(), bytes->size()) != (*entry)["fnv1a64"].get<std::uint64_t>())
      return make_error(step_dir + "/" + file + ": checksum differs from the manifest's (the file is damaged)");
    if (Result<bool> w = e.tiers.write_state(st, *bytes); !w) return make_error("--resume: " + w.error());
  }
  e.adam_step = m["adam_step"].get<long>();
  RunPosition at;
  at.iteration = m["iteration"].get<int>();
  at.data_rng = m["data_rng"].get<std::uint64_t>();
  e.iteration = at.iteration;
  return at;
}

}  // namespace memwall::exec
