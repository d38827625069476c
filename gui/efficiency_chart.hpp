// EfficiencyChart: one panel of the paper's Fig. 3 (efficiency against bandwidth) as a chart view:
// the paper's family of curves, the session's own curve in bold, and a dashed vertical marker at
// each profile bandwidth labelled with the efficiency it gives on the bold curve. It draws
// PanelData (gui/session.hpp) and computes nothing. GUI thread only.
#pragma once

#include <QList>
#include <QString>
#include <QtCharts/QChartView>
#include <QtCharts/QLineSeries>

#include "gui/session.hpp"

class QGraphicsSimpleTextItem;
class QGraphicsRectItem;

namespace memwall::gui {

// Points are plotted as (bandwidth in GB/s, efficiency in %).
constexpr double kPlotBwScale = 1e-9;
constexpr double kPlotEffScale = 100.0;

class EfficiencyChart : public QChartView {
  Q_OBJECT
 public:
  explicit EfficiencyChart(Fig3Panel panel, QWidget* parent = nullptr);

  void set_data(const PanelData& data);

  Fig3Panel panel() const { return panel_; }
  QLineSeries* config_series() const { return config_; }
  QList<QLineSeries*> family_series() const { return family_; }
  // The marker labels as drawn ("NVMe/GPU 1.56 GB/s: 11.9 %"), in profile order.
  QStringList marker_labels() const;
  const PanelData& data() const { return data_; }

  static QString marker_label(const PanelData::Marker& m);

 private:
  void place_labels();

  Fig3Panel panel_;
  PanelData data_;
  QLineSeries* config_ = nullptr;
  QList<QLineSeries*> family_;
  struct Label {
    QGraphicsRectItem* box;
    QGraphicsSimpleTextItem* text;
    double bw_gbps;
  };
  QList<Label> labels_;
};

QString panel_title(Fig3Panel panel);
QString panel_file_stem(Fig3Panel panel);  // "fig3a", "fig3b", "fig3c"

}  // namespace memwall::gui
