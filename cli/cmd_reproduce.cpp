// `memwall reproduce`: the paper's evaluation (Fig. 5a-c, 8, 9, 10) by simulation on the DGX-2
// profile, written as CSV and Markdown beside the paper's numbers. Parses and writes; sim/ works.
#include <algorithm>
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/cli_common.hpp"
#include "cli/commands.hpp"
#include "sim/reproduce.hpp"

namespace memwall::cli {

Command add_reproduce(CLI::App& app) {
  struct Flags {
    std::string figure = "all";
    std::string out = "results/sim";
    std::string profile = "dgx2";
  };
  auto f = std::make_shared<Flags>();
  CLI::App* sub = app.add_subcommand(
      "reproduce",
      "Reproduce the paper's evaluation by simulation (Fig. 5a, 5b, 5c, 8, 9, 10; seed004: 1-bit Adam\n"
      "and sparse attention as what-ifs) and write\n"
      "<figure>.csv and <figure>.md (beside the paper's numbers) into the output folder. Each row is\n"
      "simulated again with each modelled effect it includes turned off alone (the effects column: which\n"
      "move it, how far; the table's legend gives each effect's source). About 90 s for all figures.");
  sub->add_option("--figure", f->figure, "fig5a, fig5b, fig5c, fig8, fig9, fig10, seed004 or all")->capture_default_str();
  sub->add_option("-o,--output", f->out, "Output folder")->capture_default_str();
  sub->add_option("--profile", f->profile, "One node of the cluster (the paper's: dgx2)")->capture_default_str();
  return {sub, [f]() {
            HardwareProfile node = take(load_profile(f->profile));
            node.nodes = 1;
            const std::vector<std::string> known = sim::reproduction_figures();
            std::string names;
            for (const auto& n : known) names += n + ", ";
            if (f->figure != "all" && std::find(known.begin(), known.end(), f->figure) == known.end())
              throw UsageError("--figure: expected one of " + names + "or all, got \"" + f->figure + "\"");
            std::vector<std::string> figures = f->figure == "all" ? known : std::vector<std::string>{f->figure};
            make_output_folder("-o", f->out);
            for (const std::string& fig : figures) {
              auto progress = [](const std::string& what) { std::cerr << "  " << what << "\n"; };
              std::vector<sim::ReproRow> rows = take(sim::reproduce(fig, node, progress));
              write_output(f->out + "/" + fig + ".csv", sim::repro_csv(rows));
              std::string md = sim::repro_markdown(fig, rows);
              write_output(f->out + "/" + fig + ".md", md);
              std::cout << md << "\n";
            }
            return 0;
          }};
}

}  // namespace memwall::cli
