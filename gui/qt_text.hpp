// std::string to QString, the one conversion every view makes.
#pragma once

#include <QString>
#include <string>

namespace memwall::gui {

inline QString q(const std::string& s) { return QString::fromStdString(s); }

}  // namespace memwall::gui
