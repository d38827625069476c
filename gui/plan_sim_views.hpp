// PlanView and SimView: the Plan and Simulate tabs. Nothing is computed here: PlanView calls
// planner/ (make_space, search, explain, shortfall_advice), SimView calls sim/ (simulate_isolated,
// which runs SimGrid in a child process and carries the trace back when asked). Both run their
// job on a QtConcurrent worker with a busy bar; the window stays responsive. GUI thread only.
#pragma once

#include <QFutureWatcher>
#include <QString>
#include <QWidget>
#include <optional>
#include <string>
#include <vector>

#include "gui/session.hpp"
#include "planner/recommend.hpp"
#include "sim/replay.hpp"

class QCheckBox;
class QComboBox;
class QLabel;
class QProgressBar;
class QPushButton;
class QSpinBox;
class QTableWidget;
class QChartView;

namespace memwall::gui {

// ---- Plan ----

struct PlanOutcome {
  bool ok = false;
  QString error;                          // make_space's message
  planner::Recommendation recommendation; // planner::recommend: the plan `memwall plan` gives
  bool global_batch_fixed = false;        // searched with a global batch (--global-batch)
  const planner::SearchResult& result() const { return recommendation.result(); }
};

// The planner's inputs for a session: no fixes, analytic ranking unless `refine` (best 3 re-ranked
// by sim::simulate_isolated, as `memwall plan --simulate-top 3`), the global batch unconstrained
// unless `global_batch` > 0 (as `memwall plan --global-batch N`).
planner::SearchOptions plan_options(const Session& s, bool refine);
PlanOutcome run_plan(const Session& s, bool refine, long global_batch = 0);

class PlanView : public QWidget {
  Q_OBJECT
 public:
  explicit PlanView(QWidget* parent = nullptr);
  ~PlanView() override;
  void set_session(const Session& s) { session_ = s; }
  void start();          // what the Plan button does
  void wait();           // processes events until the job is done (tests)
  bool busy() const { return busy_; }
  QPushButton* button() const { return button_; }
  QCheckBox* refine_box() const { return refine_; }
  QSpinBox* global_batch_box() const { return global_batch_; }
  QTableWidget* table() const { return table_; }
  QLabel* summary() const { return summary_; }
  const std::optional<PlanOutcome>& outcome() const { return outcome_; }

 private:
  void done();
  Session session_;
  QPushButton* button_;
  QCheckBox* refine_;
  QSpinBox* global_batch_;
  QProgressBar* progress_;
  QLabel* summary_;
  QTableWidget* table_;
  QLabel* why_;
  QFutureWatcher<PlanOutcome> watcher_;
  std::optional<PlanOutcome> outcome_;
  bool busy_ = false;
};

// ---- Simulate ----

// The resource classes of SimReport::busy_fraction, one timeline row each, top to bottom.
const std::vector<std::string>& timeline_rows();
// "gpu3 pcie" -> "pcie"; a track without an instance is its class ("nvme").
std::string track_class(const std::string& track);
// Busy intervals per row (timeline_rows order), overlapping ones merged; gaps shorter than
// iteration_s / max_per_row are closed as well so that no row has more than ~max_per_row bars.
std::vector<std::vector<std::pair<double, double>>> timeline_intervals(const std::vector<TraceEvent>& events,
                                                                       double iteration_s, int max_per_row = 2000);
std::vector<std::vector<std::pair<double, double>>> timeline_intervals(const sim::SimReport& r, int max_per_row = 2000);

struct SimInputs {
  ModelSpec model;
  Placement placement;
  TrainingConfig config;
  HardwareProfile profile;
};
// The session's model (the Simulate tab's default: the one chosen in the window) or a small one
// for a quick look (2 layers, hidden 1024, 16 heads, the session's seq); the session's bsz and ci (ci capped at the model's layers); a preset.
Result<SimInputs> sim_inputs(const Session& s, bool session_model, const std::string& preset_name);

struct SimOutcome {
  bool ok = false;
  QString error;
  sim::SimReport report;
};

class SimView : public QWidget {
  Q_OBJECT
 public:
  explicit SimView(QWidget* parent = nullptr);
  ~SimView() override;
  void set_session(const Session& s);
  void start();  // what the Simulate button does
  void wait();
  bool busy() const { return busy_; }
  QPushButton* button() const { return button_; }
  QComboBox* placement_box() const { return placement_; }
  QComboBox* model_box() const { return model_; }
  QLabel* summary() const { return summary_; }
  QChartView* timeline() const { return chart_; }
  const std::optional<SimOutcome>& outcome() const { return outcome_; }
  const std::optional<SimInputs>& inputs() const { return inputs_; }
  // What the timeline draws, per row of timeline_rows().
  const std::vector<std::vector<std::pair<double, double>>>& drawn() const { return drawn_; }
  // Draws a finished report (also used by the export).
  void show_report(const sim::SimReport& r, const QString& heading);
  // "Open traces...": a measured trace (`memwall validate --trace-dir`'s measured.json, or `memwall
  // run --trace`) drawn under the simulated one; simulated.json beside it, if there, replaces the
  // simulated timeline. A file that is not a trace leaves both as they were and says why.
  bool load_traces(const QString& measured_path);
  QChartView* measured_timeline() const { return measured_chart_; }
  const std::vector<std::vector<std::pair<double, double>>>& measured_drawn() const { return measured_drawn_; }

 private:
  void done();
  Session session_;
  QComboBox* model_;
  QComboBox* placement_;
  QPushButton* button_;
  QProgressBar* progress_;
  QLabel* summary_;
  QChartView* chart_;
  QChartView* measured_chart_;
  QPushButton* open_traces_;
  std::vector<std::vector<std::pair<double, double>>> measured_drawn_;
  QFutureWatcher<SimOutcome> watcher_;
  std::optional<SimOutcome> outcome_;
  std::optional<SimInputs> inputs_;
  std::vector<std::vector<std::pair<double, double>>> drawn_;
  bool busy_ = false;
  bool placement_touched_ = false;
};

}  // namespace memwall::gui
