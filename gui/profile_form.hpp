// ProfileForm: a what-if editor for a loaded hardware profile: one line per bandwidth or capacity,
// written with units ("70 GB/s", "32 GiB") and parsed with model/units.hpp. A bad value is shown
// in red under the form and the previous value is kept. GUI thread only.
#pragma once

#include <QWidget>
#include <vector>

#include "model/hardware_profile.hpp"

class QLabel;
class QLineEdit;

namespace memwall::gui {

class ProfileForm : public QWidget {
  Q_OBJECT
 public:
  explicit ProfileForm(QWidget* parent = nullptr);

  // Shows `profile`'s values; edits apply to a copy that profile_edited() carries.
  void set_profile(const HardwareProfile& profile);
  const HardwareProfile& profile() const { return profile_; }

  // The editor of a YAML field ("links.gpu_gpu"), for tests; nullptr if there is none.
  QLineEdit* field(const QString& key) const;
  QString error_text() const;

 signals:
  void profile_edited(const memwall::HardwareProfile& profile, const QString& field);

 private:
  void commit(int index);
  QString shown(int index) const;

  HardwareProfile profile_;
  std::vector<QLineEdit*> edits_;
  QLabel* error_;
};

}  // namespace memwall::gui
