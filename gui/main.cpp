// memwall-gui: the desktop program (see gui/README.md). Parses flags and wires; gui/ and model/
// do the work. `--export DIR` renders the charts to PNG without a display and exits.
#include <CLI/CLI.hpp>
#include <QApplication>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "exec/io/user_files.hpp"
#include "gui/export.hpp"
#include "gui/main_window.hpp"

int main(int argc, char** argv) {
  // Qt picks its platform when QApplication is built: an export must work with no display at all.
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--export") == 0 || std::strncmp(argv[i], "--export=", 9) == 0) {
      qputenv("QT_QPA_PLATFORM", "offscreen");
      // An export speaks in memwall's lines only: the offscreen platform's notes ("does not support
      // propagateSizeHints", XDG_RUNTIME_DIR) are not the user's business; Qt's errors still print.
      qInstallMessageHandler([](QtMsgType type, const QMessageLogContext&, const QString& msg) {
        if (type == QtCriticalMsg || type == QtFatalMsg) std::cerr << msg.toStdString() << "\n";
      });
    }
  QApplication app(argc, argv);

  memwall::gui::SessionRequest req;
  std::string export_dir, size = "1000x650";
  CLI::App cli{"memwall-gui: efficiency against bandwidth (the paper's Fig. 3) and memory per tier, with what-ifs"};
  cli.add_option("--export", export_dir, "Write fig3a.png, fig3b.png, fig3c.png, memory.png, timeline.png and the whole window\n"
                 "(window-efficiency.png, window-memory.png) at --size into DIR and exit");
  cli.add_option("--profile", req.profile, "Hardware profile: a built-in name or a YAML file")->capture_default_str();
  cli.add_option("--model", req.model, "Catalogue model or model YAML")->capture_default_str();
  cli.add_option("--layers", req.layers, "Custom model: layers (with --hidden and --heads)");
  cli.add_option("--hidden", req.hidden, "Custom model: hidden size, e.g. 8K");
  cli.add_option("--heads", req.heads, "Custom model: attention heads");
  cli.add_option("--bsz", req.bsz, "Micro-batch per GPU")->capture_default_str();
  cli.add_option("--seq", req.seq, "Sequence length (default: the model's)");
  cli.add_option("--ci", req.ci, "Checkpoint interval in transformer blocks")->capture_default_str();
  cli.add_option("--peak", req.peak, "Achievable peak per GPU for Fig. 3, e.g. \"70 TFLOPS\" (default: the profile's)");
  cli.add_option("--strategy", req.placement, "Placement preset for the memory view")->capture_default_str();
  cli.add_option("--size", size, "PNG size WIDTHxHEIGHT for --export")->capture_default_str();
  try {
    cli.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return cli.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "memwall-gui: " << e.what() << "\n";
    return 2;
  }
  int w = 0, h = 0;
  if (std::sscanf(size.c_str(), "%dx%d", &w, &h) != 2 || w < 200 || h < 150 || w > 8000 || h > 8000) {
    std::cerr << "memwall-gui: --size: expected WIDTHxHEIGHT between 200x150 and 8000x8000, got \"" << size << "\"\n";
    return 2;
  }
  memwall::Result<memwall::gui::Session> s = memwall::gui::make_session(req);
  if (!s) {
    std::cerr << "memwall-gui: " << s.error() << "\n";
    return 2;
  }
  const bool exporting = cli.count("--export") > 0;
  if (exporting) {
    // The destination before any work: an empty name or a folder that cannot be made or written
    // into is bad input (exit 2), not a window.
    if (memwall::Result<bool> r = memwall::io::make_output_folder(export_dir); !r) {
      std::cerr << "memwall-gui: --export: " << r.error() << "\n";
      return 2;
    }
    memwall::Result<QStringList> out = memwall::gui::export_pngs(*s, QString::fromStdString(export_dir), QSize(w, h));
    if (!out) {
      std::cerr << "memwall-gui: " << out.error() << "\n";
      return 1;
    }
    for (const QString& p : *out) std::cout << p.toStdString() << "\n";
    return 0;
  }
  memwall::gui::MainWindow window(*s);
  window.show();
  return app.exec();
}
