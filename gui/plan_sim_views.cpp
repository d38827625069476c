#include "gui/plan_sim_views.hpp"
#include "gui/qt_text.hpp"

#include <QAreaSeries>
#include <QDir>
#include <QFileInfo>
#include <QFileDialog>
#include <QCategoryAxis>
#include <QChart>
#include <QChartView>
#include <QCheckBox>
#include <QComboBox>
#include <QCoreApplication>
#include <QEventLoop>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QLabel>
#include <QLineSeries>
#include <QProgressBar>
#include <QPushButton>
#include <QSpinBox>
#include <QTableWidget>
#include <QVBoxLayout>
#include <QValueAxis>
#include <QtConcurrent/QtConcurrentRun>
#include <algorithm>
#include <set>

#include "model/units.hpp"

namespace memwall::gui {
namespace {


QProgressBar* busy_bar() {
  auto* p = new QProgressBar;
  p->setRange(0, 0);
  p->setMaximumHeight(8);
  p->setTextVisible(false);
  p->setVisible(false);
  return p;
}

}  // namespace

// ---------------------------------------------------------------- Plan

planner::SearchOptions plan_options(const Session& s, bool refine) {
  planner::SearchOptions so;
  if (refine) {
    // As `memwall plan --simulate-top 3`: each candidate simulated in its own child process.
    so.refine_top = 3;
    so.refine = [m = s.model, p = s.profile](const planner::Candidate& c) {
      return sim::replay_for_ranking(m, c.placement, c.config, p).iteration_s;
    };
  }
  return so;
}

PlanOutcome run_plan(const Session& s, bool refine, long global_batch) {
  PlanOutcome out;
  const planner::Fixes fixes;
  Result<planner::SearchSpace> space = planner::make_space(s.model, s.profile, fixes);
  if (space && global_batch > 0) space = planner::with_global_batch(std::move(*space), global_batch);
  out.global_batch_fixed = global_batch > 0;
  if (!space) {
    out.error = q(space.error());
    return out;
  }
  // The paper's sizes: the GUI does not link the executor, so for a profile `memwall run` executes
  // (an executor: section) its schedule check counts the paper's bytes, not the executor's buffers.
  out.recommendation = planner::recommend(s.model, s.profile, *space, fixes, plan_options(s, refine));
  out.ok = true;
  return out;
}

PlanView::PlanView(QWidget* parent) : QWidget(parent) {
  auto* v = new QVBoxLayout(this);
  auto* row = new QHBoxLayout;
  button_ = new QPushButton("Plan");
  button_->setObjectName("plan_button");
  button_->setToolTip("memwall plan for the session's profile and model: the fastest placement, bsz, ci, tiling, mp");
  refine_ = new QCheckBox("re-rank best 3 by simulation");
  refine_->setObjectName("plan_refine");
  refine_->setToolTip("memwall plan --simulate-top 3: seconds to minutes per candidate on paper-sized models");
  global_batch_ = new QSpinBox;
  global_batch_->setObjectName("plan_global_batch");
  global_batch_->setRange(0, 1 << 30);
  global_batch_->setSpecialValueText("unconstrained");
  global_batch_->setPrefix("global batch ");
  global_batch_->setToolTip("memwall plan --global-batch N: samples per optimizer step, bsz x grad-accum x dp; "
                            "0: unconstrained (dp = every GPU / mp, no accumulation)");
  row->addWidget(button_);
  row->addWidget(refine_);
  row->addWidget(global_batch_);
  row->addStretch(1);
  v->addLayout(row);
  progress_ = busy_bar();
  v->addWidget(progress_);
  summary_ = new QLabel("Press Plan to search placements, micro-batch, checkpoint interval, tiling and tensor slicing.");
  summary_->setObjectName("plan_summary");
  summary_->setWordWrap(true);
  summary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  v->addWidget(summary_);
  table_ = new QTableWidget(0, 12);
  table_->setObjectName("plan_table");
  table_->setHorizontalHeaderLabels(
      {"", "strategy", "bsz", "ci", "tiling", "mp", "dp", "accum", "pp", "TFLOPS/GPU", "iteration s", "binding limit"});
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  table_->horizontalHeader()->setStretchLastSection(true);
  table_->verticalHeader()->setVisible(false);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  v->addWidget(table_, 1);
  why_ = new QLabel;
  why_->setObjectName("plan_why");
  why_->setWordWrap(true);
  why_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  v->addWidget(why_);
  connect(button_, &QPushButton::clicked, this, &PlanView::start);
  connect(&watcher_, &QFutureWatcher<PlanOutcome>::finished, this, &PlanView::done);
}

PlanView::~PlanView() { watcher_.waitForFinished(); }

void PlanView::start() {
  if (watcher_.isRunning()) return;
  busy_ = true;
  button_->setEnabled(false);
  progress_->setVisible(true);
  summary_->setText("planning " + q(session_.model.name) + " on " + q(session_.profile.name) + " ...");
  watcher_.setFuture(QtConcurrent::run([s = session_, refine = refine_->isChecked(), n = long(global_batch_->value())] {
    return run_plan(s, refine, n);
  }));
}

void PlanView::done() {
  outcome_ = watcher_.result();
  const PlanOutcome& o = *outcome_;
  busy_ = false;
  button_->setEnabled(true);
  progress_->setVisible(false);
  table_->setRowCount(0);
  why_->clear();
  if (!o.ok) {
    summary_->setText("<span style='color:#d62728'>" + o.error.toHtmlEscaped() + "</span>");
    return;
  }
  const planner::Recommendation& rec = o.recommendation;
  const planner::SearchResult& r = rec.result();
  const char* ranking = rec.fits() ? rec.chosen->ranked_by() : "analytic";
  const QString searched = QString("%1 candidates, %2 checked, %3 ms; %4")
                               .arg(r.space_size)
                               .arg(r.evaluated)
                               .arg(r.elapsed_s * 1e3, 0, 'f', 1)
                               .arg(refine_->isChecked()
                                        ? QString("best 3 re-ranked by simulation; ranking %1 chose the plan").arg(ranking)
                                        : QString("ranking analytic"));
  if (!rec.fits()) {
    QString text = "<b>" + q(session_.model.name) + " does not fit on " + q(session_.profile.name) + "</b>: " +
                   q(rec.shortfall).toHtmlEscaped();
    if (r.closest)
      text += "<br>closest: " + q(planner::placement_label(r.closest->candidate.placement)) + ": " +
              q(r.closest->fit.binding().sentence()).toHtmlEscaped();
    summary_->setText(text + "<br>" + searched);
    return;
  }
  const planner::Evaluated& best = *rec.chosen;
  const QString simulated =
      best.simulated_s ? QString("; simulated %1 TFLOPS per GPU, iteration %2 s")
                             .arg(*best.simulated_tflops_per_gpu(), 0, 'g', 4)
                             .arg(*best.simulated_s, 0, 'g', 4)
                       : QString();
  summary_->setText(QString("<b>chosen: %1</b>, bsz %2, ci %3, tiling %4, mp %5%11: analytic %6 TFLOPS per GPU, iteration "
                            "%7 s%10<br>binding limit: %8<br>%9")
                        .arg(q(planner::placement_label(best.candidate.placement)))
                        .arg(best.candidate.config.bsz)
                        .arg(best.candidate.config.ci)
                        .arg(best.candidate.config.tiling_factor)
                        .arg(best.candidate.config.mp)
                        .arg(best.time.tflops_per_gpu, 0, 'g', 4)
                        .arg(best.time.iteration_s, 0, 'g', 4)
                        .arg(q(best.fit.binding().sentence()).toHtmlEscaped() + "<br>" +
                             q(planner::global_batch_words(best.candidate.config, o.global_batch_fixed, session_.profile))
                                 .toHtmlEscaped() +
                             "<br>" + q(rec.schedule_check).toHtmlEscaped())
                        .arg(searched)
                        .arg(simulated)
                        .arg(best.candidate.config.pp > 1
                                 ? QString(", pp %1 (1F1B, bubble %2 %)")
                                       .arg(best.candidate.config.pp)
                                       .arg(100.0 * (best.candidate.config.pp - 1) /
                                                (best.candidate.config.grad_accum + best.candidate.config.pp - 1),
                                            0, 'f', 1)
                                 : QString()));
  // Rows: the chosen plan (planner::recommend's, checked against the detailed schedule), then the
  // runners-up `memwall plan` lists (planner::runners_up): every other placement and six more.
  std::vector<const planner::Evaluated*> rows = {&best};
  for (const planner::Evaluated* e : planner::runners_up(r, best, int(r.ranked.size()) + 6, rec.checked.rejected_keys)) rows.push_back(e);
  for (size_t i = 0; i < rows.size(); ++i) {
    const planner::Evaluated& e = *rows[i];
    const TrainingConfig& c = e.candidate.config;
    const double iter = e.simulated_s ? *e.simulated_s : e.time.iteration_s;
    const QStringList cells = {i == 0 ? "chosen" : QString("#%1").arg(i + 1),
                               q(planner::placement_label(e.candidate.placement)),
                               QString::number(c.bsz),
                               QString::number(c.ci),
                               QString::number(c.tiling_factor),
                               QString::number(c.mp),
                               QString::number(c.dp),
                               QString::number(c.grad_accum),
                               c.pp > 1 ? QString("%1 (1F1B)").arg(c.pp) : QString("1"),
                               QString::number(e.time.tflops_per_gpu, 'g', 4),
                               QString::number(iter, 'g', 4) + (e.simulated_s ? " (sim)" : ""),
                               q(e.fit.binding().sentence())};
    table_->insertRow(int(i));
    for (int col = 0; col < cells.size(); ++col) {
      auto* item = new QTableWidgetItem(cells[col]);
      item->setToolTip(q(e.fit.binding().sentence()));
      if (i == 0) {
        QFont f = item->font();
        f.setBold(true);
        item->setFont(f);
      }
      table_->setItem(int(i), col, item);
    }
  }
  QString why = "<b>why it won</b> (planner::explain):<ul>";
  for (const std::string& w : rec.explanation) why += "<li>" + q(w).toHtmlEscaped() + "</li>";
  why_->setText(why + "</ul>");
}

void PlanView::wait() {
  while (watcher_.isRunning() || busy_) QCoreApplication::processEvents(QEventLoop::AllEvents, 20);
}

// ---------------------------------------------------------------- Simulate

const std::vector<std::string>& timeline_rows() {
  static const std::vector<std::string> rows = {"gpu_compute", "pcie", "nvlink", "nvme", "network", "cpu"};
  return rows;
}

std::string track_class(const std::string& track) {
  auto sp = track.rfind(' ');
  return sp == std::string::npos ? track : track.substr(sp + 1);
}

std::vector<std::vector<std::pair<double, double>>> timeline_intervals(const sim::SimReport& r, int max_per_row) {
  return timeline_intervals(r.trace, r.iteration_s, max_per_row);
}

std::vector<std::vector<std::pair<double, double>>> timeline_intervals(const std::vector<TraceEvent>& events,
                                                                       double iteration_s, int max_per_row) {
  const std::vector<std::string>& rows = timeline_rows();
  std::vector<std::vector<std::pair<double, double>>> raw(rows.size()), out(rows.size());
  for (const TraceEvent& e : events) {
    // a measured trace names the CPU optimizer's track "cpu" and the link of a copy "pcie", as sim
    auto it = std::find(rows.begin(), rows.end(), track_class(e.track));
    if (it != rows.end()) raw[size_t(it - rows.begin())].push_back({e.start_s, e.end_s});
  }
  const double min_gap = max_per_row > 0 && iteration_s > 0 ? iteration_s / max_per_row : 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::sort(raw[i].begin(), raw[i].end());
    for (auto [s, f] : raw[i]) {
      if (!out[i].empty() && s <= out[i].back().second + min_gap) out[i].back().second = std::max(out[i].back().second, f);
      else out[i].push_back({s, f});
    }
  }
  return out;
}

Result<SimInputs> sim_inputs(const Session& s, bool session_model, const std::string& preset_name) {
  SimInputs in;
  if (session_model) {
    in.model = s.model;
  } else {
    Result<ModelSpec> m = model_from_shape(2, 1024, 16, s.config.seq);
    if (!m) return make_error(m.error());
    in.model = *m;
    in.model.name = "small (2 layers, hidden 1024)";
  }
  Result<Placement> pl = preset(preset_name);
  if (!pl) return make_error(pl.error());
  in.placement = *pl;
  in.config = s.config;
  in.config.ci = std::min(in.config.ci, in.model.layers);
  in.profile = s.profile;
  return in;
}

namespace {

// One row per resource class of timeline_rows(), busy intervals as filled bars, over [0, iteration).
void draw_timeline(QChart* chart, const std::vector<std::vector<std::pair<double, double>>>& drawn, double iteration_s) {
  chart->removeAllSeries();
  for (QAbstractAxis* a : chart->axes()) {
    chart->removeAxis(a);
    delete a;
  }
  const std::vector<std::string>& rows = timeline_rows();
  const double end_ms = std::max(iteration_s * 1e3, 1e-9);
  auto* x = new QValueAxis;
  x->setRange(0, end_ms);
  x->applyNiceNumbers();  // ticks at round times (0, 20, 40 ... ms), not at fifths of the iteration
  x->setTitleText("time in the iteration (ms)");
  auto* y = new QCategoryAxis;
  const int n = int(rows.size());
  y->setRange(-0.5, n - 0.5);
  y->setStartValue(-0.5);
  y->setLabelsPosition(QCategoryAxis::AxisLabelsPositionCenter);
  for (int i = n - 1; i >= 0; --i) y->append(q(rows[size_t(i)]), (n - 1 - i) + 0.5);  // first row on top
  chart->addAxis(x, Qt::AlignBottom);
  chart->addAxis(y, Qt::AlignLeft);
  static const QColor colors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"};
  for (size_t i = 0; i < rows.size(); ++i) {
    if (drawn[i].empty()) continue;
    // One area per row: a step line that is up while the resource is busy, over a flat base.
    // Bars are at least 0.1 % of the iteration wide so that every interval stays visible.
    const double lo = double(n - 1 - int(i)) - 0.35, hi = lo + 0.7, min_ms = end_ms * 1e-3;
    auto* upper = new QLineSeries;
    auto* lower = new QLineSeries;
    QList<QPointF> pts;
    pts.reserve(int(drawn[i].size()) * 4 + 2);
    pts << QPointF(0, lo);
    for (auto [s, f] : drawn[i]) {
      const double a = s * 1e3, b = std::max(f * 1e3, a + min_ms);
      pts << QPointF(a, lo) << QPointF(a, hi) << QPointF(b, hi) << QPointF(b, lo);
    }
    pts << QPointF(end_ms, lo);
    upper->replace(pts);
    lower->replace({QPointF(0, lo), QPointF(end_ms, lo)});
    auto* area = new QAreaSeries(upper, lower);
    upper->setParent(area);  // QAreaSeries does not own its lines: they go with it (LeakSanitizer)
    lower->setParent(area);
    area->setName(q(rows[i]));
    area->setColor(colors[i % 6]);
    area->setPen(Qt::NoPen);
    chart->addSeries(area);
    area->attachAxis(x);
    area->attachAxis(y);
  }
}

}  // namespace

SimView::SimView(QWidget* parent) : QWidget(parent) {
  auto* v = new QVBoxLayout(this);
  auto* row = new QHBoxLayout;
  model_ = new QComboBox;
  model_->setObjectName("sim_model");
  // the window's model first (the one chosen on the left, named in set_session), the small one
  // for a quick look (a paper-sized model replays in seconds to minutes when tiled)
  model_->addItem("the window's model");
  model_->addItem("small: 2 layers, hidden 1024, 16 heads (quick)");
  placement_ = new QComboBox;
  placement_->setObjectName("sim_placement");
  for (const std::string& n : preset_names()) placement_->addItem(q(n));
  button_ = new QPushButton("Simulate");
  button_->setObjectName("simulate_button");
  button_->setToolTip("memwall simulate: one iteration replayed on SimGrid with the session's profile, bsz and ci");
  row->addWidget(new QLabel("model"));
  row->addWidget(model_, 1);
  row->addWidget(new QLabel("placement"));
  row->addWidget(placement_, 1);
  row->addWidget(button_);
  v->addLayout(row);
  progress_ = busy_bar();
  v->addWidget(progress_);
  summary_ = new QLabel("Press Simulate to replay one iteration on SimGrid.");
  summary_->setObjectName("sim_summary");
  summary_->setWordWrap(true);
  summary_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  v->addWidget(summary_);
  chart_ = new QChartView;
  chart_->setObjectName("sim_timeline");
  chart_->setRenderHint(QPainter::Antialiasing, false);
  chart_->chart()->legend()->hide();
  chart_->setMinimumHeight(300);
  v->addWidget(chart_, 1);
  measured_chart_ = new QChartView;
  measured_chart_->setObjectName("measured_timeline");
  measured_chart_->setRenderHint(QPainter::Antialiasing, false);
  measured_chart_->chart()->legend()->hide();
  measured_chart_->setMinimumHeight(300);
  measured_chart_->setVisible(false);
  v->addWidget(measured_chart_, 1);
  open_traces_ = new QPushButton("Open traces...");
  open_traces_->setObjectName("open_traces_button");
  open_traces_->setToolTip("A measured trace (memwall validate --trace-dir: measured.json, or memwall run --trace) "
                           "beside the simulated one (simulated.json in the same folder)");
  row->addWidget(open_traces_);
  connect(open_traces_, &QPushButton::clicked, this, [this] {
    const QString path = QFileDialog::getOpenFileName(this, "Measured trace", QString(), "Chrome traces (*.json)");
    if (!path.isEmpty()) load_traces(path);
  });
  connect(button_, &QPushButton::clicked, this, &SimView::start);
  connect(placement_, &QComboBox::activated, this, [this] { placement_touched_ = true; });
  connect(&watcher_, &QFutureWatcher<SimOutcome>::finished, this, &SimView::done);
}

SimView::~SimView() { watcher_.waitForFinished(); }

void SimView::set_session(const Session& s) {
  session_ = s;
  model_->setItemText(0, "the window's model: " + q(s.model.name) + " (" + QString::number(s.model.layers) +
                             " layers, hidden " + QString::number(s.model.hidden) + ")");
  if (!placement_touched_) placement_->setCurrentText(q(s.placement));  // follows the left panel until chosen here
}

void SimView::start() {
  if (watcher_.isRunning()) return;
  Result<SimInputs> in = sim_inputs(session_, model_->currentIndex() == 0, placement_->currentText().toStdString());
  if (!in) {
    summary_->setText("<span style='color:#d62728'>" + q(in.error()).toHtmlEscaped() + "</span>");
    return;
  }
  inputs_ = *in;
  busy_ = true;
  button_->setEnabled(false);
  progress_->setVisible(true);
  summary_->setText("simulating " + q(in->model.name) + " with " + placement_->currentText() + " ...");
  watcher_.setFuture(QtConcurrent::run([in = *in] {
    SimOutcome out;
    sim::SimOptions o;
    o.trace = true;
    Result<sim::SimReport> r = sim::simulate_isolated(in.model, in.placement, in.config, in.profile, o);
    out.ok = r.ok();
    if (r) out.report = std::move(r).value();
    else out.error = q(r.error());
    return out;
  }));
}

void SimView::done() {
  outcome_ = watcher_.result();
  busy_ = false;
  button_->setEnabled(true);
  progress_->setVisible(false);
  const SimOutcome& o = *outcome_;
  if (!o.ok) {
    summary_->setText("<span style='color:#d62728'>" + o.error.toHtmlEscaped() + "</span>");
    return;
  }
  const SimInputs& in = *inputs_;
  show_report(o.report, QString("%1 on %2 with %3, bsz %4, seq %5, ci %6")
                            .arg(q(in.model.name), q(in.profile.name), q(in.placement.name))
                            .arg(in.config.bsz)
                            .arg(in.config.seq)
                            .arg(in.config.ci));
}

void SimView::show_report(const sim::SimReport& r, const QString& heading) {
  QChart* chart = chart_->chart();
  chart->removeAllSeries();
  for (QAbstractAxis* a : chart->axes()) {
    chart->removeAxis(a);
    delete a;
  }
  drawn_.clear();
  if (r.overflow) {
    summary_->setText("<b>" + heading.toHtmlEscaped() + "</b>: <span style='color:#d62728'>does not fit, nothing "
                      "simulated: " + q(r.overflow->message).toHtmlEscaped() + "</span>");
    chart->setTitle("");
    return;
  }
  QString busy;
  for (const auto& [k, f] : r.busy_fraction) busy += QString(" %1 %2 %,").arg(q(k)).arg(100.0 * f, 0, 'f', 1);
  busy.chop(1);
  summary_->setText(QString("<b>%1</b><br>iteration <b>%2 s</b>, <b>%3 TFLOPS per GPU</b>, efficiency <b>%4 %</b> of "
                            "%5 (%6 GPUs, dp %7, mp %8; %9 activities)<br>busy:%10")
                        .arg(heading.toHtmlEscaped())
                        .arg(r.iteration_s, 0, 'g', 6)
                        .arg(r.tflops_per_gpu, 0, 'g', 4)
                        .arg(100.0 * r.efficiency, 0, 'f', 1)
                        .arg(q(format_flops_rate(r.peak_flops_per_s)))
                        .arg(r.gpus)
                        .arg(r.dp)
                        .arg(r.mp)
                        .arg(r.activities)
                        .arg(busy));
  drawn_ = timeline_intervals(r);
  draw_timeline(chart, drawn_, r.iteration_s);
  chart->setTitle(QString("busy intervals per resource class (node 0, %1)").arg(q(r.strategy)));
}

bool SimView::load_traces(const QString& measured_path) {
  auto fail = [this](const std::string& why) {
    summary_->setText("<span style='color:#d62728'>" + q(why).toHtmlEscaped() + "</span>");
    return false;
  };
  Result<std::vector<TraceEvent>> measured = read_chrome_trace(measured_path.toStdString());
  if (!measured) return fail(measured.error());
  const QString sim_path = QFileInfo(measured_path).dir().filePath("simulated.json");
  std::optional<std::vector<TraceEvent>> simulated;
  if (sim_path != measured_path && QFileInfo::exists(sim_path)) {
    Result<std::vector<TraceEvent>> r = read_chrome_trace(sim_path.toStdString());
    if (!r) return fail(r.error());
    simulated = std::move(r).value();
  }
  auto end_of = [](const std::vector<TraceEvent>& ev) {
    double e = 0;
    for (const TraceEvent& t : ev) e = std::max(e, t.end_s);
    return e;
  };
  // both on one time axis: the longer iteration sets it
  const double span = std::max(end_of(*measured), simulated ? end_of(*simulated) : 0.0);
  measured_drawn_ = timeline_intervals(*measured, span);
  draw_timeline(measured_chart_->chart(), measured_drawn_, span);
  measured_chart_->chart()->setTitle(QString("measured: %1 (%2 ms)").arg(measured_path).arg(end_of(*measured) * 1e3, 0, 'g', 4));
  measured_chart_->setVisible(true);
  QString text = QString("measured iteration <b>%1 ms</b> (%2)").arg(end_of(*measured) * 1e3, 0, 'g', 4).arg(measured_path.toHtmlEscaped());
  if (simulated) {
    drawn_ = timeline_intervals(*simulated, span);
    draw_timeline(chart_->chart(), drawn_, span);
    chart_->chart()->setTitle(QString("simulated: %1 (%2 ms)").arg(sim_path).arg(end_of(*simulated) * 1e3, 0, 'g', 4));
    text += QString("; simulated <b>%1 ms</b> (%2)").arg(end_of(*simulated) * 1e3, 0, 'g', 4).arg(sim_path.toHtmlEscaped());
  }
  summary_->setText(text);
  return true;
}

void SimView::wait() {
  while (watcher_.isRunning() || busy_) QCoreApplication::processEvents(QEventLoop::AllEvents, 20);
}

}  // namespace memwall::gui
