#include "gui/memory_view.hpp"

#include <QHBoxLayout>
#include <QLabel>
#include <QProgressBar>
#include <QVBoxLayout>
#include <QtCharts/QBarCategoryAxis>
#include <QtCharts/QBarSet>
#include <QtCharts/QChart>
#include <QtCharts/QChartView>
#include <QtCharts/QLineSeries>
#include <QtCharts/QStackedBarSeries>
#include <QtCharts/QValueAxis>

#include "model/placement.hpp"
#include "model/units.hpp"

namespace memwall::gui {
namespace {

struct Segment {
  const char* name;
  QColor color;
};
const Segment kSegments[4] = {
    {"param16", QColor("#1f77b4")},
    {"grad16", QColor("#ff7f0e")},
    {"optim32", QColor("#2ca02c")},
    {"transient at peak", QColor("#bcbcbc")},
};
// The transient parts, lightest last: greys and muted tones that stay apart from the states'.
const QColor kParts[] = {QColor("#7f7f7f"), QColor("#c49c94"), QColor("#9edae5"), QColor("#dbdb8d"),
                         QColor("#c5b0d5"), QColor("#f7b6d2"), QColor("#bcbcbc")};
const QColor kFits("#2ca02c"), kOverflow("#d62728");
const char* kTierTitle[3] = {"GPU (one GPU)", "CPU memory (share per GPU)", "NVMe (share per GPU)"};

QString swatch(const QColor& color, const QString& name) {
  return QString("<span style='color:%1;font-size:15px'>&#9632;</span>&nbsp;%2&nbsp;&nbsp;&nbsp;").arg(color.name(), name);
}

// The states and the capacity line; then, per tier, what its transient bytes at the peak are.
QString legend_html(const std::array<std::vector<std::pair<std::string, double>>, 3>& parts) {
  QString html;
  for (int s = 0; s < 3; ++s) html += swatch(kSegments[s].color, kSegments[s].name);
  html += QString("<span style='color:%1'>&#9472;&#9472;</span>&nbsp;capacity").arg(kOverflow.name());
  static const char* const tier_names[3] = {"GPU", "CPU", "NVMe"};
  for (int t = 0; t < 3; ++t) {
    if (parts[size_t(t)].empty()) continue;
    html += QString("<br><b>%1 transient at the peak:</b> ").arg(tier_names[t]);
    for (std::size_t i = 0; i < parts[size_t(t)].size(); ++i)
      html += swatch(kParts[std::min(i, std::size(kParts) - 1)],
                     QString::fromStdString(parts[size_t(t)][i].first + " " + format_bytes(parts[size_t(t)][i].second))
                         .toHtmlEscaped());
  }
  return html;
}

// Axis unit: GiB below 2 TiB, TiB above.
std::pair<double, QString> unit_for(double bytes) {
  const double gib = 1024.0 * 1024 * 1024;
  return bytes < 1024 * gib ? std::pair{gib, QString("GiB")} : std::pair{1024 * gib, QString("TiB")};
}

}  // namespace

QString memory_heading(const Session& s, const MemoryData& d) {
  return QString("%1: %2 on %3, bytes per GPU at the schedule's peak (rank %4 of dp %5, bsz %6, seq %7, ci %8)")
      .arg(QString::fromStdString(d.placement), QString::fromStdString(s.model.name),
           QString::fromStdString(s.profile.name))
      .arg(d.rank)
      .arg(d.dp)
      .arg(s.config.bsz)
      .arg(s.config.seq)
      .arg(s.config.ci);
}

MemoryView::MemoryView(QWidget* parent) : QWidget(parent) {
  auto* layout = new QVBoxLayout(this);
  heading_ = new QLabel;
  heading_->setWordWrap(true);
  QFont hf = heading_->font();
  hf.setBold(true);
  hf.setPointSizeF(hf.pointSizeF() * 1.15);
  heading_->setFont(hf);
  status_ = new QLabel;
  status_->setWordWrap(true);
  status_->setObjectName("memory_status");
  progress_ = new QProgressBar;
  progress_->setRange(0, 0);  // busy indicator: the schedule reports no fraction done
  progress_->setFormat("building the schedule...");
  progress_->setTextVisible(true);
  progress_->setVisible(false);
  layout->addWidget(heading_);
  layout->addWidget(status_);
  layout->addWidget(progress_);
  auto* row = new QHBoxLayout;
  for (int t = 0; t < 3; ++t) {
    auto* chart = new QChart;
    chart->legend()->setVisible(false);
    chart->setBackgroundRoundness(0);
    chart->setMargins(QMargins(2, 2, 2, 2));
    views_[t] = new QChartView(chart);
    views_[t]->setRenderHint(QPainter::Antialiasing);
    views_[t]->setBackgroundBrush(Qt::white);
    views_[t]->setMinimumSize(220, 260);
    row->addWidget(views_[t]);
  }
  layout->addLayout(row, 1);
  legend_ = new QLabel(legend_html({}));
  legend_->setWordWrap(true);
  layout->addWidget(legend_);
}

void MemoryView::set_busy(bool busy) {
  busy_ = busy;
  progress_->setVisible(busy);
}

QString MemoryView::status_text() const { return status_->text(); }

void MemoryView::set_error(const QString& message) {
  status_->setStyleSheet(QString("color:%1").arg(kOverflow.name()));
  status_->setText(message);
}

void MemoryView::set_data(const MemoryData& data, const QString& heading) {
  heading_->setText(heading);
  if (data.overflow.empty()) {
    status_->setStyleSheet(QString("color:%1").arg(kFits.name()));
    const std::string& at = data.memory.of(Tier::gpu).moment;
    status_->setText("fits: every tier stays within its capacity for the whole iteration" +
                     (at.empty() ? QString() : QString("; the GPU peaks at the ") + QString::fromStdString(at)));
  } else {
    status_->setStyleSheet(QString("color:%1").arg(kOverflow.name()));
    status_->setText("does not fit: " + QString::fromStdString(data.overflow));
  }
  for (int t = 0; t < 3; ++t) {
    const TierMemory& tm = data.memory.tiers[size_t(t)];
    double transient = tm.peak_bytes;
    for (int st = 0; st < 3; ++st) transient -= tm.persistent[size_t(st)];
    QChart* chart = views_[t]->chart();
    chart->removeAllSeries();
    for (QAbstractAxis* a : chart->axes()) {
      chart->removeAxis(a);
      delete a;
    }
    // not a structured binding: clang 14 cannot capture one in the lambda below
    const auto unit_and_name = unit_for(std::max(tm.capacity_bytes, tm.peak_bytes));
    const double unit = unit_and_name.first;
    const auto& unit_name = unit_and_name.second;
    auto* bars = new QStackedBarSeries;
    bars->setBarWidth(0.55);
    for (int s = 0; s < 4; ++s) drawn_[t][s] = s < 3 ? tm.persistent[size_t(s)] : std::max(0.0, transient);
    // the states, then the transient bytes part by part: the memory model's buffers at the peak,
    // and whatever of the transient they do not name (checkpoints held as a state on this tier)
    std::vector<std::pair<std::string, double>>& parts = parts_[size_t(t)];
    parts.clear();
    double named = 0;
    for (std::size_t i = tm.parts.size() - std::min(tm.buffer_parts, tm.parts.size()); i < tm.parts.size(); ++i)
      if (tm.parts[i].bytes > 0) {
        parts.emplace_back(tm.parts[i].what, tm.parts[i].bytes);
        named += tm.parts[i].bytes;
      }
    if (drawn_[t][3] - named > 1e-9 * std::max(1.0, drawn_[t][3]))
      parts.emplace_back("other transient bytes at the peak", drawn_[t][3] - named);
    else if (named > drawn_[t][3] && !parts.empty())  // rounding: keep the sum equal to the transient
      parts.back().second -= named - drawn_[t][3];
    auto add_set = [&](const QString& name, double bytes, const QColor& color) {
      auto* set = new QBarSet(name);
      set->setColor(color);
      set->setBorderColor(color.darker(130));
      *set << bytes / unit;
      bars->append(set);
    };
    for (int s = 0; s < 3; ++s) add_set(kSegments[s].name, drawn_[t][s], kSegments[s].color);
    for (std::size_t i = 0; i < parts.size(); ++i)
      add_set(QString::fromStdString(parts[i].first), parts[i].second, kParts[std::min(i, std::size(kParts) - 1)]);
    chart->addSeries(bars);
    auto* x = new QBarCategoryAxis;
    x->append(to_string(Tier(t)));
    auto* y = new QValueAxis;
    y->setRange(0, std::max(tm.capacity_bytes, tm.peak_bytes) / unit * 1.12);
    y->applyNiceNumbers();
    y->setLabelFormat("%g");
    y->setTitleText(unit_name + " per GPU");
    chart->addAxis(x, Qt::AlignBottom);
    chart->addAxis(y, Qt::AlignLeft);
    bars->attachAxis(x);
    bars->attachAxis(y);
    auto* cap = new QLineSeries;
    cap->setName("capacity");
    cap->append(-0.5, tm.capacity_bytes / unit);
    cap->append(0.5, tm.capacity_bytes / unit);
    cap->setPen(QPen(kOverflow, 2.5, Qt::DashLine));
    chart->addSeries(cap);
    cap->attachAxis(x);
    cap->attachAxis(y);

    const bool fits = tm.fits();
    chart->setTitle(QString("<b>%1</b><br>peak %2 of %3<br><span style='color:%4'>%5</span>")
                        .arg(kTierTitle[t], QString::fromStdString(format_bytes(tm.peak_bytes)),
                             QString::fromStdString(format_bytes(tm.capacity_bytes)),
                             (fits ? kFits : kOverflow).name(),
                             fits ? "fits" : QString("does not fit: %1 over").arg(QString::fromStdString(
                                                 format_bytes(tm.peak_bytes - tm.capacity_bytes)))));
    chart->setBackgroundBrush(fits ? QBrush(Qt::white) : QBrush(QColor("#fff0f0")));
  }
  legend_->setText(legend_html(parts_));
}

}  // namespace memwall::gui
