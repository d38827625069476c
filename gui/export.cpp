#include "gui/export.hpp"

#include <QApplication>
#include <QDir>
#include <QPixmap>

#include "gui/efficiency_chart.hpp"
#include "gui/memory_view.hpp"

namespace memwall::gui {
namespace {

// A widget that was never shown has no layout yet: show it off screen, let it lay out, grab it.
QString save(QWidget* w, QSize size, const QString& path) {
  w->setAttribute(Qt::WA_DontShowOnScreen);
  w->resize(size);
  w->show();
  QApplication::processEvents();
  QPixmap pm = w->grab();
  w->hide();
  if (pm.size() != size) pm = pm.scaled(size, Qt::IgnoreAspectRatio, Qt::SmoothTransformation);
  if (!pm.save(path, "PNG")) return path + ": cannot write the PNG";
  return {};
}

}  // namespace

Result<QStringList> export_pngs(const Session& s, const QString& dir, QSize size) {
  if (!QDir().mkpath(dir)) return make_error(dir.toStdString() + ": cannot create the directory");
  QStringList written;
  for (Fig3Panel p : {Fig3Panel::a_param_grad, Fig3Panel::b_optimizer, Fig3Panel::c_act_ckpt}) {
    EfficiencyChart chart(p);
    chart.set_data(panel_data(s, p));
    const QString path = QDir(dir).filePath(panel_file_stem(p) + ".png");
    if (QString err = save(&chart, size, path); !err.isEmpty()) return make_error(err.toStdString());
    written << path;
  }
  Result<MemoryData> m = memory_data(s);
  if (!m) return make_error(m.error());
  MemoryView view;
  view.setAutoFillBackground(true);
  view.setStyleSheet("background:white");
  view.set_data(*m, memory_heading(s, *m));
  const QString path = QDir(dir).filePath("memory.png");
  if (QString err = save(&view, size, path); !err.isEmpty()) return make_error(err.toStdString());
  written << path;
  return written;
}

}  // namespace memwall::gui
