// memwall: the command. Parses flags, dispatches to one subcommand and turns every exception into
// one line on stderr: bad input (a flag, a file) exits 2, anything else is "internal error" and
// exits 1. Nothing else lives here.
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "cli/cli_common.hpp"
#include "cli/commands.hpp"
#include "exec/backend/backend.hpp"
#include "model/suggest.hpp"

namespace {

// Two settings a library reads once, when the program starts, so memwall starts itself again with
// them in its environment (its path from /proc/self/exe, the same arguments, the same process) when
// they are missing; a user's own setting of either is kept. Call it first in main, before any
// thread or MPI exists. It returns when there was nothing to set, or when the exec failed (the
// program then runs with the libraries' defaults).
//  - OMP_WAIT_POLICY=passive (`passive_openmp`): unset, OpenMP (GCC's libgomp, which OpenBLAS's
//    OpenMP build shares) lets a thread with nothing to do spin (some 300000 pause loops) before it
//    sleeps, taking the core that another process, or this one's next serial piece, needs.
//  - glibc.malloc.hugetlb=1 in GLIBC_TUNABLES: malloc asks for transparent huge pages
//    (madvise(MADV_HUGEPAGE)) where the kernel gives them only on request (Debian's default,
//    transparent_hugepage=madvise). A schedule of millions of steps, and the replay's activities,
//    are millions of small allocations: in 4 KiB pages `reproduce --figure fig5b` spent a third of
//    its time in the kernel, faulting pages in; in 2 MiB pages it takes 0.6x the time, with the
//    same values bit for bit.
// MEMWALL_STARTED_AGAIN marks the second start: glibc 2.36's loader cuts GLIBC_TUNABLES after the
// first tunable in the environment the program sees (applying them all), so without it a user's
// "glibc.malloc.check=0" would read as missing the huge pages at every start, forever.
void start_with_settings(char** argv, bool passive_openmp) {
  if (std::getenv("MEMWALL_STARTED_AGAIN") != nullptr) return;
  bool changed = false;
  if (passive_openmp && std::getenv("OMP_WAIT_POLICY") == nullptr) {
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
    changed = true;
  }
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables == nullptr || std::strstr(tunables, "glibc.malloc.hugetlb") == nullptr) {
    const std::string v = tunables != nullptr && *tunables != '\0' ? std::string(tunables) + ":glibc.malloc.hugetlb=1"
                                                                   : std::string("glibc.malloc.hugetlb=1");
    if (setenv("GLIBC_TUNABLES", v.c_str(), 1) != 0) return;
    changed = true;
  }
  if (!changed || setenv("MEMWALL_STARTED_AGAIN", "1", 1) != 0) return;
  // the program's own path, not /proc/self/exe: the process takes its name (ps, top) from it
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
  if (n <= 0 || std::size_t(n) >= sizeof path - 1) return;
  path[n] = '\0';
  execv(path, argv);
  // still here: the exec failed; the libraries keep the defaults they read at load
}

// One line, whatever the message holds (library messages may quote input with newlines in it).
CLI::App* chosen(CLI::App& app) {
  for (CLI::App* sub : app.get_subcommands({}))
    if (sub->parsed()) return sub;
  return nullptr;
}

std::string command_name(CLI::App& app) {
  CLI::App* sub = chosen(app);
  return sub ? "memwall " + sub->get_name() : "memwall";
}

// "--modle: not a flag of memwall analyze (did you mean --model?)": an argument CLI11 did not
// expect, with the flags (or, before a subcommand, the subcommands) closest to it.
std::string unexpected(CLI::App& app, const CLI::ExtrasError& e) {
  CLI::App* sub = chosen(app);
  CLI::App& where = sub ? *sub : app;
  const std::vector<std::string> extras = where.remaining();
  if (extras.empty()) return e.what();
  std::vector<std::string> known;
  if (sub) {
    for (const CLI::Option* o : sub->get_options())
      for (const std::string& n : o->get_lnames()) known.push_back("--" + n);
  } else {
    for (const CLI::App* c : app.get_subcommands({})) known.push_back(c->get_name());
  }
  for (const std::string& x : extras) {
    const std::string word = x.substr(0, x.find('='));
    if (!sub && word.starts_with("-"))  // "memwall --versio": the flags before a command are --help and --version
      return word + ": not a flag of memwall" + memwall::did_you_mean(word, {"--help", "--version"}) +
             " (a command comes first: memwall <command> --help)";
    if (!sub) return "unknown command \"" + word + "\"" + memwall::did_you_mean(word, known) + " (see memwall --help)";
    if (word.starts_with("-"))
      return word + ": not a flag of " + command_name(app) + memwall::did_you_mean(word, known);
  }
  return "unexpected argument \"" + extras.front() + "\" (flags take their value after them: --flag VALUE)";
}

}  // namespace

int main(int argc, char** argv) {
  // Only the commands that compute on the cpu backend load OpenMP's threads into work, and only
  // they and `reproduce` run long enough for huge pages to repay a second start (some 0.08 s: the
  // linking of memwall's libraries); the others (plan, analyze, simulate, ...) start once (issue 28
  // item 7: `plan` as a whole process in 0.2 s).
  if (argc > 1) {
    const std::string_view command = argv[1];
    if (command == "run" || command == "validate" || command == "calibrate")
      start_with_settings(argv, true);  // may start this program again, with them set
    else if (command == "reproduce")
      start_with_settings(argv, false);
  }
  using namespace memwall::cli;
  using memwall::one_line;
  CLI::App app{
      "memwall: see, plan and run transformer training that does not fit in GPU memory (ZeRO-Infinity).\n"
      "Run `memwall <command> --help` for the flags of one command."};
  app.require_subcommand(1);
  app.set_version_flag("--version", [] { return "memwall 0.1.0\n" + memwall::exec::backends_report(); },
                       "Print the version, the backends compiled in, the CUDA devices found and whether cuBLAS "
                       "loads, and exit");

  const std::vector<Command> commands = {
      add_analyze(app),
      add_schedule(app),
      add_simulate(app),
      add_reproduce(app),
      add_models(app),
      add_profiles(app),
      add_io_bench(app),
      add_adam_bench(app),
      add_plan(app),
      add_run(app),
      add_calibrate(app),
      add_validate(app),
      add_completion(app),
  };

  // A failed command leaves no folder it made and left empty (-o DIR of --reproduce, --save, ...).
  struct MadeFolders {
    bool keep = false;
    ~MadeFolders() {
      if (keep) return;
      std::error_code ec;
      for (const std::string& d : made_output_folders()) std::filesystem::remove(d, ec);  // only when empty
    }
  } made;
  try {
    app.parse(argc, argv);
    // A flag given an empty value ("-o ''", "--resume ''") is refused rather than read as not given.
    if (CLI::App* sub = chosen(app))
      for (const CLI::Option* o : sub->get_options())
        if (o->get_type_size_min() > 0)
          for (const std::string& r : o->results())
            if (r.empty())
              throw UsageError((o->get_snames().empty() ? "--" + o->get_lnames().front() : "-" + o->get_snames().front()) +
                               ": expected a value, got an empty string");
    for (auto& [sub, run] : commands)
      if (sub->parsed()) {
        const int rc = run();
        made.keep = rc == 0;
        return rc;
      }
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ExtrasError& e) {
    const std::string name = command_name(app);
    std::cerr << name << ": " << one_line(unexpected(app, e)) << " (see " << name << " --help)\n";
    return 2;
  } catch (const CLI::ParseError& e) {
    const std::string name = command_name(app);
    // "memwall simulat": CLI11 says a subcommand is required; the word given is the better clue
    if (!chosen(app) && !app.remaining().empty()) {
      std::cerr << "memwall: " << one_line(unexpected(app, CLI::ExtrasError(app.remaining()))) << "\n";
      return 2;
    }
    // a flag given twice: CLI11's "--steps: At Most 1 required but received 2"
    std::string what = e.what();
    if (const size_t at = what.find(": At Most 1 required but received "); at != std::string::npos)
      what = what.substr(0, at) + ": given " + what.substr(at + 34) + " times; give it once";
    std::cerr << name << ": " << one_line(what) << " (see " << name << " --help)\n";
    return 2;
  } catch (const UsageError& e) {
    std::cerr << command_name(app) << ": " << one_line(e.what()) << "\n";
    return 2;
  } catch (const std::bad_alloc&) {
    std::cerr << command_name(app) << ": out of memory (the input asks for more than this machine has)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << command_name(app) << ": internal error: " << one_line(e.what()) << "\n";
    return 1;
  } catch (...) {
    std::cerr << command_name(app) << ": internal error: unknown exception\n";
    return 1;
  }
  return 2;
}
