#include "gui/efficiency_chart.hpp"

#include <algorithm>

#include <QGraphicsRectItem>
#include <QGraphicsSimpleTextItem>
#include <QPen>
#include <QtCharts/QChart>
#include <QtCharts/QLegendMarker>
#include <QtCharts/QLogValueAxis>
#include <QtCharts/QScatterSeries>
#include <QtCharts/QValueAxis>

#include "model/units.hpp"

namespace memwall::gui {
namespace {

// Curves of the paper's family go from light to dark; the session's curve is red and thick.
const QColor kFamily[] = {QColor("#8cbfdd"), QColor("#5a9fcf"), QColor("#3480bd"),
                          QColor("#1763a6"), QColor("#0b4887"), QColor("#062d5c")};
const QColor kConfig("#d62728");
const QColor kMarker[] = {QColor("#2ca02c"), QColor("#9467bd"), QColor("#ff7f0e"), QColor("#8c564b")};
constexpr double kBwMinGBps = 0.1, kBwMaxGBps = 10000;

QString series_label(const SweepPoint& p) {
  return p.hidden > 0 ? QString("hd %1K").arg(p.hidden / 1024.0) : QString("bsz %1").arg(p.bsz);
}
// The family's legend names: panel (c)'s six hidden sizes without the repeated "hd " (the first
// says it), so all seven entries fit beside each other.
QString family_label(const SweepPoint& p, bool first) {
  return p.hidden > 0 && !first ? QString("%1K").arg(p.hidden / 1024.0) : series_label(p);
}

void hide_from_legend(QChart* chart, QAbstractSeries* s) {
  for (QLegendMarker* m : chart->legend()->markers(s)) m->setVisible(false);
}

}  // namespace

QString panel_title(Fig3Panel panel) {
  switch (panel) {
    case Fig3Panel::a_param_grad: return "(a) parameters and gradients: AIT = seq·bsz (Eq. 9)";
    case Fig3Panel::b_optimizer: return "(b) optimizer states: AIT = seq·bsz/4 (Eq. 10)";
    case Fig3Panel::c_act_ckpt: return "(c) activation checkpoints: AIT = 24·hd·ci (Eq. 11)";
  }
  return {};
}

QString panel_file_stem(Fig3Panel panel) {
  switch (panel) {
    case Fig3Panel::a_param_grad: return "fig3a";
    case Fig3Panel::b_optimizer: return "fig3b";
    case Fig3Panel::c_act_ckpt: return "fig3c";
  }
  return {};
}

QString EfficiencyChart::marker_label(const PanelData::Marker& m) {
  return QString("%1 %2: %3 %")
      .arg(QString::fromStdString(m.name), QString::fromStdString(format_bandwidth(m.bw_Bps)))
      .arg(100.0 * m.efficiency, 0, 'f', 1);
}

EfficiencyChart::EfficiencyChart(Fig3Panel panel, QWidget* parent) : QChartView(parent), panel_(panel) {
  auto* chart = new QChart;
  chart->setTitle(panel_title(panel));
  chart->setBackgroundRoundness(0);
  setBackgroundBrush(Qt::white);
  chart->legend()->setAlignment(Qt::AlignBottom);
  // a legend that fits a panel of a 1280 x 800 window: a smaller font, the full text as a tooltip
  // where Qt still has to elide one
  QFont legend_font = chart->legend()->font();
  legend_font.setPointSizeF(legend_font.pointSizeF() * 0.8);
  chart->legend()->setFont(legend_font);
  chart->legend()->setShowToolTips(true);
  chart->setMargins(QMargins(4, 4, 4, 4));
  auto* x = new QLogValueAxis;
  x->setBase(10);
  x->setRange(kBwMinGBps, kBwMaxGBps);
  x->setLabelFormat("%g");
  x->setTitleText("bandwidth (GB/s, log scale)");
  x->setMinorTickCount(8);
  auto* y = new QValueAxis;
  y->setRange(0, 100);
  y->setTickCount(11);
  y->setLabelFormat("%.0f");
  y->setTitleText("efficiency (%)");
  chart->addAxis(x, Qt::AlignBottom);
  chart->addAxis(y, Qt::AlignLeft);
  // QChartView made a default chart of its own; setChart hands it back to us instead of deleting it
  // (Qt: "ownership of the previous chart is released"), so it is deleted here (LeakSanitizer).
  QChart* made_by_view = this->chart();
  setChart(chart);
  delete made_by_view;
  setRenderHint(QPainter::Antialiasing);
  setMinimumSize(360, 260);
  connect(chart, &QChart::plotAreaChanged, this, [this](const QRectF&) { place_labels(); });
}

void EfficiencyChart::set_data(const PanelData& data) {
  data_ = data;
  QChart* chart = this->chart();
  chart->setTitle(QString("<div align='center'><b>%1</b><br><span style='color:#555'>%2</span></div>")
                      .arg(panel_title(panel_).toHtmlEscaped(), QString::fromStdString(data.caption).toHtmlEscaped()));
  for (const Label& l : labels_) {
    delete l.text;
    delete l.box;
  }
  labels_.clear();
  chart->removeAllSeries();
  family_.clear();
  QAbstractAxis* x = chart->axes(Qt::Horizontal).front();
  QAbstractAxis* y = chart->axes(Qt::Vertical).front();
  auto add = [&](QAbstractSeries* s) {
    chart->addSeries(s);
    s->attachAxis(x);
    s->attachAxis(y);
  };
  auto curve = [&](const std::vector<SweepPoint>& pts) {
    auto* s = new QLineSeries;
    QList<QPointF> xy;
    for (const SweepPoint& p : pts) xy.append({p.bw_Bps * kPlotBwScale, p.efficiency * kPlotEffScale});
    s->replace(xy);
    return s;
  };

  for (size_t i = 0; i < data.family.size(); ++i) {
    QLineSeries* s = curve(data.family[i]);
    s->setName(family_label(data.family[i].front(), i == 0));
    s->setPen(QPen(kFamily[std::min<size_t>(i, std::size(kFamily) - 1)], 1.6));
    add(s);
    family_.append(s);
  }
  config_ = curve(data.config_curve);
  config_->setObjectName("config_curve");
  config_->setName("this run: " + series_label(data.config_curve.front()));
  config_->setPen(QPen(kConfig, 3.2));
  add(config_);

  auto* dots = new QScatterSeries;
  dots->setMarkerSize(9);
  dots->setColor(kConfig);
  dots->setBorderColor(Qt::white);
  for (size_t i = 0; i < data.markers.size(); ++i) {
    const PanelData::Marker& m = data.markers[i];
    const double bx = m.bw_Bps * kPlotBwScale;
    const QColor color = kMarker[i % std::size(kMarker)];
    auto* line = new QLineSeries;
    line->setName(QString::fromStdString(m.name));
    line->append(bx, 0);
    line->append(bx, 100);
    QPen pen(color, 1.6, Qt::DashLine);
    line->setPen(pen);
    add(line);
    hide_from_legend(chart, line);
    dots->append(bx, m.efficiency * kPlotEffScale);

    auto* box = new QGraphicsRectItem(chart);
    box->setBrush(QColor(255, 255, 255, 225));
    box->setPen(QPen(color, 1.2));
    box->setZValue(10);
    auto* text = new QGraphicsSimpleTextItem(marker_label(m), chart);
    text->setBrush(color.darker(140));
    text->setZValue(11);
    labels_.append({box, text, bx});
  }
  add(dots);
  hide_from_legend(chart, dots);
  place_labels();
}

QStringList EfficiencyChart::marker_labels() const {
  QStringList out;
  for (const Label& l : labels_) out << l.text->text();
  return out;
}

// Labels sit in rows from the top of the plot (lowest bandwidth first), right of their marker,
// or left of it when they would leave the plot.
void EfficiencyChart::place_labels() {
  const QRectF area = chart()->plotArea();
  if (area.isEmpty() || labels_.isEmpty()) return;
  QList<int> order;
  for (int i = 0; i < labels_.size(); ++i) order << i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return labels_[a].bw_gbps < labels_[b].bw_gbps; });
  // Rows go where the bold curve is not: at the top when it is mostly low at the markers.
  double mean = 0;
  for (const PanelData::Marker& m : data_.markers) mean += m.efficiency / data_.markers.size();
  double row_h = 0;
  for (const Label& l : labels_) row_h = std::max(row_h, l.text->boundingRect().height() + 6);
  double top = mean < 0.5 ? area.top() + 6 : area.bottom() - 6 - row_h * labels_.size();
  for (int i : order) {
    const Label& l = labels_[i];
    const QRectF tb = l.text->boundingRect();
    const double mx = chart()->mapToPosition(QPointF(l.bw_gbps, 0)).x();
    double left = mx + 5;
    if (left + tb.width() + 4 > area.right()) left = mx - 5 - tb.width() - 4;
    l.text->setPos(left + 2, top + 1);
    l.box->setRect(left, top, tb.width() + 4, tb.height() + 2);
    top += row_h;
  }
}

}  // namespace memwall::gui
