// Headless export: renders the three Fig. 3 panels and the memory view of a session to PNG files
// (fig3a.png, fig3b.png, fig3c.png, memory.png) and the Simulate tab's timeline of the small default
// model under the session's preset (timeline.png) with the same widgets the window shows. Needs a
// QApplication (the offscreen platform is enough). GUI thread only.
#pragma once

#include <QSize>
#include <QString>
#include <QStringList>

#include "gui/session.hpp"

namespace memwall::gui {

// Writes the PNGs into `dir` (made if its parent exists; io::make_output_folder); returns the paths
// written, or an error naming the file that could not be written, after removing the PNGs this
// call wrote (each is written whole through a temporary, so none is ever truncated). The memory
// schedule and the simulation run synchronously.
Result<QStringList> export_pngs(const Session& s, const QString& dir, QSize size = QSize(1000, 650));

}  // namespace memwall::gui
