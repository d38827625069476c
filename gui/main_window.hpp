// MainWindow: the memwall-gui window. Left: the hardware profile (built-in or any YAML, with a
// what-if form), the model (catalogue or layers/hidden/heads) and the training controls. Right:
// tabs for the three Fig. 3 panels with the analysis table, the memory per tier of a placement,
// the planner (Plan) and the simulator (Simulate).
// It wires controls to a Session and Session to views; model/ computes everything. The memory
// view's schedule, the plan and the simulation run on worker threads (QtConcurrent).
// GUI thread only.
#pragma once

#include <QFutureWatcher>
#include <QMainWindow>
#include <array>
#include <functional>

#include "gui/session.hpp"

class QComboBox;
class QDoubleSpinBox;
class QLabel;
class QPushButton;
class QSpinBox;
class QTableWidget;
class QTabWidget;
class QTimer;

namespace memwall::gui {

class EfficiencyChart;
class MemoryView;
class PlanView;
class SimView;
class ProfileForm;

// What a finished memory job hands back to the GUI thread.
struct MemoryOutcome {
  bool ok = false;
  QString error;
  MemoryData data;
  QString heading;
};

class MainWindow : public QMainWindow {
  Q_OBJECT
 public:
  // Shows a one-line error to the user (a QMessageBox by default); tests may replace it.
  using ErrorReporter = std::function<void(QWidget* parent, const QString& message)>;

  explicit MainWindow(Session initial, QWidget* parent = nullptr);
  ~MainWindow() override;

  void set_error_reporter(ErrorReporter reporter) { report_error_ = std::move(reporter); }

  // Loads a built-in profile or a YAML file. On error: reports load_profile's message, keeps the
  // current profile, returns false.
  bool open_profile(const QString& name_or_path);

  const Session& session() const { return session_; }
  EfficiencyChart* chart(Fig3Panel panel) const { return charts_[int(panel)]; }
  MemoryView* memory_view() const { return memory_; }
  PlanView* plan_view() const { return plan_; }
  SimView* sim_view() const { return sim_; }
  QTabWidget* tabs() const { return tabs_; }
  ProfileForm* profile_form() const { return form_; }
  QDoubleSpinBox* bsz_box() const { return bsz_; }
  QSpinBox* hidden_box() const { return hidden_; }

  // Runs any pending memory job to the end, processing events meanwhile (tests, export).
  void wait_for_memory();

 private:
  QWidget* build_controls();
  QWidget* build_efficiency_tab();
  void load_into_controls();     // session -> widgets, signals blocked
  void training_changed();
  void catalogue_chosen(int index);
  void shape_changed();
  void refresh();                // session -> charts, table, memory (debounced)
  void fill_table();
  void start_memory_job();
  void memory_job_done();

  Session session_;
  HardwareProfile loaded_profile_;  // as loaded, before what-if edits
  ErrorReporter report_error_;

  QComboBox* profile_combo_ = nullptr;
  QPushButton* open_button_ = nullptr;
  QLabel* profile_label_ = nullptr;
  ProfileForm* form_ = nullptr;
  QComboBox* model_combo_ = nullptr;
  QSpinBox* layers_ = nullptr;
  QSpinBox* hidden_ = nullptr;
  QSpinBox* heads_ = nullptr;
  QLabel* model_label_ = nullptr;
  QDoubleSpinBox* bsz_ = nullptr;
  QSpinBox* seq_ = nullptr;
  QSpinBox* ci_ = nullptr;
  QDoubleSpinBox* peak_ = nullptr;
  QComboBox* placement_ = nullptr;
  QTabWidget* tabs_ = nullptr;
  std::array<EfficiencyChart*, 3> charts_{};
  QTableWidget* table_ = nullptr;
  QLabel* table_title_ = nullptr;
  MemoryView* memory_ = nullptr;
  PlanView* plan_ = nullptr;
  SimView* sim_ = nullptr;

  QTimer* memory_timer_ = nullptr;  // coalesces bursts of control changes into one schedule
  QFutureWatcher<MemoryOutcome> memory_watcher_;
  bool memory_pending_ = false;     // inputs changed while a job ran: run again when it ends
};

}  // namespace memwall::gui
