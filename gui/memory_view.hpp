// MemoryView: bytes per rank on each tier (gpu, cpu, nvme) for a placement preset, one stacked
// bar per tier against that tier's capacity, with what does not fit in red, and when the GPU
// peaks. It draws MemoryData (gui/session.hpp, the memory model's) and computes nothing. While a schedule is being built
// it shows a busy bar and keeps the previous picture. GUI thread only.
#pragma once

#include <QWidget>
#include <array>
#include <string>
#include <utility>
#include <vector>

#include "gui/session.hpp"

class QLabel;
class QProgressBar;
class QChartView;
class QStackedBarSeries;

namespace memwall::gui {

// "zero_inf_nvme: fig2a-1T on dgx2, rank 0 of dp 16, bsz 2, seq 1024, ci 1".
QString memory_heading(const Session& s, const MemoryData& d);

class MemoryView : public QWidget {
  Q_OBJECT
 public:
  explicit MemoryView(QWidget* parent = nullptr);

  void set_busy(bool busy);
  void set_data(const MemoryData& data, const QString& heading);
  void set_error(const QString& message);

  bool busy() const { return busy_; }
  // Bar values as drawn, in bytes: [tier][segment] with segments param16, grad16, optim32, transient.
  std::array<std::array<double, 4>, 3> drawn_bytes() const { return drawn_; }
  // The transient bytes of a tier as drawn, part by part (the memory model's buffers at the peak:
  // fetched parameters, checkpoints, working memory, staging buffers ...); they add up to
  // drawn_bytes()[tier][3].
  const std::vector<std::pair<std::string, double>>& transient_parts(int tier) const { return parts_[size_t(tier)]; }
  QString status_text() const;

 private:
  QLabel* heading_;
  QLabel* status_;
  QLabel* legend_;
  QProgressBar* progress_;
  std::array<QChartView*, 3> views_{};
  std::array<std::array<double, 4>, 3> drawn_{};
  std::array<std::vector<std::pair<std::string, double>>, 3> parts_;
  bool busy_ = false;
};

}  // namespace memwall::gui
