#include "gui/profile_form.hpp"

#include <QFormLayout>
#include <QLabel>
#include <QLineEdit>
#include <QVBoxLayout>

#include "model/units.hpp"

namespace memwall::gui {
namespace {

// The editable fields, named as in the profile YAML.
struct Field {
  const char* key;
  Dimension dim;
  double HardwareProfile::*member;
  const char* help;
};
const Field kFields[] = {
    {"gpu.memory", Dimension::bytes, &HardwareProfile::gpu_memory_bytes, "memory of one GPU"},
    {"links.gpu_gpu", Dimension::bandwidth, &HardwareProfile::gpu_gpu_Bps, "per GPU inside a node (NVLink/NVSwitch)"},
    {"links.pcie_single_gpu", Dimension::bandwidth, &HardwareProfile::pcie_single_gpu_Bps,
     "one GPU alone to or from CPU memory"},
    {"links.pcie_aggregate", Dimension::bandwidth, &HardwareProfile::pcie_aggregate_Bps,
     "per node, all GPUs moving data at once"},
    {"cpu.memory", Dimension::bytes, &HardwareProfile::cpu_memory_bytes, "per node"},
    {"cpu.memory_bandwidth", Dimension::bandwidth, &HardwareProfile::cpu_memory_Bps, "per node"},
    {"nvme.capacity", Dimension::bytes, &HardwareProfile::nvme_capacity_bytes, "per node"},
    {"nvme.read", Dimension::bandwidth, &HardwareProfile::nvme_read_Bps, "per node"},
    {"nvme.write", Dimension::bandwidth, &HardwareProfile::nvme_write_Bps, "per node"},
};

}  // namespace

ProfileForm::ProfileForm(QWidget* parent) : QWidget(parent) {
  auto* outer = new QVBoxLayout(this);
  outer->setContentsMargins(0, 0, 0, 0);
  auto* form = new QFormLayout;
  for (int i = 0; i < int(std::size(kFields)); ++i) {
    auto* e = new QLineEdit;
    e->setObjectName(kFields[i].key);
    e->setToolTip(QString("%1; e.g. %2").arg(kFields[i].help, QString::fromUtf8(dimension_example(kFields[i].dim).data(),
                                                                                   dimension_example(kFields[i].dim).size())));
    connect(e, &QLineEdit::editingFinished, this, [this, i] { commit(i); });
    form->addRow(kFields[i].key, e);
    edits_.push_back(e);
  }
  outer->addLayout(form);
  error_ = new QLabel;
  error_->setObjectName("what_if_error");
  error_->setWordWrap(true);
  error_->setStyleSheet("color:#d62728");
  outer->addWidget(error_);
}

QString ProfileForm::shown(int i) const {
  const double v = profile_.*kFields[i].member;
  return QString::fromStdString(kFields[i].dim == Dimension::bytes ? format_bytes(v) : format_bandwidth(v));
}

void ProfileForm::set_profile(const HardwareProfile& profile) {
  profile_ = profile;
  for (size_t i = 0; i < edits_.size(); ++i) {
    edits_[i]->setText(shown(int(i)));
    edits_[i]->setModified(false);
  }
  error_->clear();
}

QLineEdit* ProfileForm::field(const QString& key) const {
  for (QLineEdit* e : edits_)
    if (e->objectName() == key) return e;
  return nullptr;
}

QString ProfileForm::error_text() const { return error_->text(); }

void ProfileForm::commit(int i) {
  QLineEdit* e = edits_[i];
  if (e->text() == shown(i)) return;  // focus left without a change: keep the exact loaded value
  const Field& f = kFields[i];
  Result<double> v = parse_quantity(e->text().toStdString(), f.dim);
  QString problem;
  if (!v) problem = QString::fromStdString(v.error());
  else if (!(*v > 0)) problem = "expected a positive value";
  if (!problem.isEmpty()) {
    error_->setText(QString("%1: %2; kept %3").arg(f.key, problem, shown(i)));
    e->setText(shown(i));
    return;
  }
  error_->clear();
  profile_.*f.member = *v;
  e->setText(shown(i));
  emit profile_edited(profile_, f.key);
}

}  // namespace memwall::gui
