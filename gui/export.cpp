#include "gui/export.hpp"

#include <QApplication>
#include <QBuffer>
#include <QFile>
#include <QDir>
#include <QPixmap>

#include "exec/io/user_files.hpp"
#include "gui/efficiency_chart.hpp"
#include "gui/main_window.hpp"
#include "gui/memory_view.hpp"
#include "gui/plan_sim_views.hpp"

namespace memwall::gui {
namespace {

// A widget that was never shown has no layout yet: show it off screen, let it lay out, grab it.
// The PNG is encoded in memory and written through a temporary and a rename, so a full disk leaves
// no truncated PNG behind.
QString save(QWidget* w, QSize size, const QString& path) {
  w->setAttribute(Qt::WA_DontShowOnScreen);
  w->resize(size);
  w->show();
  QApplication::processEvents();
  QPixmap pm = w->grab();
  w->hide();
  if (pm.size() != size) pm = pm.scaled(size, Qt::IgnoreAspectRatio, Qt::SmoothTransformation);
  QByteArray png;
  QBuffer buffer(&png);
  buffer.open(QIODevice::WriteOnly);
  if (!pm.save(&buffer, "PNG")) return path + ": cannot encode the PNG";
  if (Result<bool> r = io::write_output_file(path.toStdString(), std::string_view(png.constData(), std::size_t(png.size())));
      !r)
    return QString::fromStdString(r.error());
  return {};
}

// All or nothing: when one PNG cannot be written, the ones this export already wrote go too.
Result<QStringList> undo(const QStringList& written, const std::string& error) {
  for (const QString& p : written) QFile::remove(p);
  return make_error(error);
}

}  // namespace

Result<QStringList> export_pngs(const Session& s, const QString& dir, QSize size) {
  if (Result<bool> r = io::make_output_folder(dir.toStdString()); !r) return make_error(r.error());
  QStringList written;
  for (Fig3Panel p : {Fig3Panel::a_param_grad, Fig3Panel::b_optimizer, Fig3Panel::c_act_ckpt}) {
    EfficiencyChart chart(p);
    chart.set_data(panel_data(s, p));
    const QString path = QDir(dir).filePath(panel_file_stem(p) + ".png");
    if (QString err = save(&chart, size, path); !err.isEmpty()) return undo(written, err.toStdString());
    written << path;
  }
  Result<MemoryData> m = memory_data(s);
  if (!m) return undo(written, m.error());
  MemoryView view;
  view.setAutoFillBackground(true);
  view.setStyleSheet("background:white");
  view.set_data(*m, memory_heading(s, *m));
  const QString path = QDir(dir).filePath("memory.png");
  if (QString err = save(&view, size, path); !err.isEmpty()) return undo(written, err.toStdString());
  written << path;

  // The Simulate tab's timeline: its small model (quick; the tab defaults to the window's) under the
  // session's preset.
  Result<SimInputs> in = sim_inputs(s, false, s.placement);
  if (!in) return undo(written, in.error());
  sim::SimOptions o;
  o.trace = true;
  Result<sim::SimReport> r = sim::simulate_isolated(in->model, in->placement, in->config, in->profile, o);
  if (!r) return undo(written, r.error());
  SimView sim_view;
  sim_view.set_session(s);
  sim_view.setAutoFillBackground(true);
  sim_view.setStyleSheet("background:white");
  sim_view.show_report(*r, QString("%1 on %2 with %3, bsz %4, ci %5")
                               .arg(QString::fromStdString(in->model.name), QString::fromStdString(in->profile.name),
                                    QString::fromStdString(in->placement.name))
                               .arg(in->config.bsz)
                               .arg(in->config.ci));
  const QString tpath = QDir(dir).filePath("timeline.png");
  if (QString err = save(&sim_view, size, tpath); !err.isEmpty()) return undo(written, err.toStdString());
  written << tpath;

  // The whole window at this size, on its efficiency and memory tabs: what a user sees on a screen
  // of that size (1280x800: a laptop).
  MainWindow window(s);
  window.wait_for_memory();
  for (const auto& [tab, name] : {std::pair{0, "window-efficiency.png"}, std::pair{1, "window-memory.png"}}) {
    window.tabs()->setCurrentIndex(tab);
    const QString wpath = QDir(dir).filePath(name);
    if (QString err = save(&window, size, wpath); !err.isEmpty()) return undo(written, err.toStdString());
    written << wpath;
  }
  return written;
}

}  // namespace memwall::gui
