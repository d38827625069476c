#include "gui/main_window.hpp"
#include "gui/qt_text.hpp"

#include <QComboBox>
#include <QCoreApplication>
#include <QEventLoop>
#include <QDoubleSpinBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QGridLayout>
#include <QGroupBox>
#include <QHeaderView>
#include <QLabel>
#include <QMessageBox>
#include <QPushButton>
#include <QScrollArea>
#include <QSignalBlocker>
#include <QSpinBox>
#include <QGuiApplication>
#include <QScreen>
#include <QSplitter>
#include <QStatusBar>
#include <QTabWidget>
#include <QTableWidget>
#include <QTimer>
#include <QVBoxLayout>
#include <QtConcurrent/QtConcurrentRun>

#include "gui/efficiency_chart.hpp"
#include "gui/memory_view.hpp"
#include "gui/plan_sim_views.hpp"
#include "gui/profile_form.hpp"
#include "model/units.hpp"

namespace memwall::gui {
namespace {

constexpr double kTera = 1e12;
const char* kCustom = "custom (layers / hidden / heads)";

}  // namespace

MainWindow::MainWindow(Session initial, QWidget* parent)
    : QMainWindow(parent), session_(std::move(initial)), loaded_profile_(session_.profile) {
  report_error_ = [](QWidget* parent_widget, const QString& message) {
    QMessageBox::critical(parent_widget, "memwall-gui: cannot load profile", message);
  };
  setWindowTitle("memwall: efficiency and memory of ZeRO-Infinity training");

  memory_timer_ = new QTimer(this);
  memory_timer_->setSingleShot(true);
  memory_timer_->setInterval(150);
  connect(memory_timer_, &QTimer::timeout, this, &MainWindow::start_memory_job);
  connect(&memory_watcher_, &QFutureWatcher<MemoryOutcome>::finished, this, &MainWindow::memory_job_done);

  auto* split = new QSplitter;
  split->addWidget(build_controls());
  tabs_ = new QTabWidget;
  tabs_->addTab(build_efficiency_tab(), "Efficiency vs bandwidth (Fig. 3)");
  memory_ = new MemoryView;
  tabs_->addTab(memory_, "Memory per tier");
  plan_ = new PlanView;
  tabs_->addTab(plan_, "Plan");
  tabs_->setTabToolTip(2, "memwall plan (planner/): the fastest placement, bsz, ci, tiling and mp for this profile and model");
  sim_ = new SimView;
  tabs_->addTab(sim_, "Simulate");
  tabs_->setTabToolTip(3, "memwall simulate (sim/): one iteration replayed on SimGrid, with a timeline");
  split->addWidget(tabs_);
  split->setStretchFactor(1, 1);
  setCentralWidget(split);
  // 1500 x 950 where the screen has room; on a smaller one (a 1280 x 800 laptop) the window fits its
  // available area, and the panels scroll or shrink (minimumSizeHint stays within 1280 x 800)
  QSize want(1500, 950);
  if (const QScreen* screen = QGuiApplication::primaryScreen())
    want = want.boundedTo(screen->availableGeometry().size() * 0.95);
  resize(want);

  load_into_controls();
  refresh();
}

MainWindow::~MainWindow() { memory_watcher_.waitForFinished(); }

QWidget* MainWindow::build_controls() {
  auto* panel = new QWidget;
  auto* v = new QVBoxLayout(panel);

  auto* prof = new QGroupBox("Hardware profile");
  auto* pv = new QVBoxLayout(prof);
  auto* row = new QHBoxLayout;
  profile_combo_ = new QComboBox;
  profile_combo_->setObjectName("profile_combo");
  for (const std::string& n : builtin_profile_names()) profile_combo_->addItem(q(n), q(n));
  open_button_ = new QPushButton("Open YAML...");
  row->addWidget(profile_combo_, 1);
  row->addWidget(open_button_);
  pv->addLayout(row);
  profile_label_ = new QLabel;
  profile_label_->setWordWrap(true);
  pv->addWidget(profile_label_);
  form_ = new ProfileForm;
  pv->addWidget(form_);
  auto* undo = new QPushButton("Undo what-if edits");
  undo->setObjectName("undo_what_if");
  pv->addWidget(undo);
  connect(undo, &QPushButton::clicked, this, [this] {
    session_.profile = loaded_profile_;
    load_into_controls();
    refresh();
  });
  v->addWidget(prof);

  auto* model = new QGroupBox("Model");
  auto* mf = new QFormLayout(model);
  model_combo_ = new QComboBox;
  model_combo_->setObjectName("model_combo");
  for (const CatalogueEntry& e : model_catalogue()) model_combo_->addItem(q(e.spec.name));
  model_combo_->addItem(kCustom);
  layers_ = new QSpinBox;
  layers_->setRange(1, 100000);
  hidden_ = new QSpinBox;
  hidden_->setObjectName("hidden");
  hidden_->setRange(64, 1 << 22);
  hidden_->setSingleStep(1024);
  heads_ = new QSpinBox;
  heads_->setRange(1, 1 << 16);
  model_label_ = new QLabel;
  model_label_->setObjectName("model_label");
  model_label_->setWordWrap(true);
  mf->addRow("catalogue", model_combo_);
  mf->addRow("layers (nl)", layers_);
  mf->addRow("hidden (hd)", hidden_);
  mf->addRow("heads", heads_);
  mf->addRow(model_label_);
  v->addWidget(model);

  auto* train = new QGroupBox("Training and Fig. 3");
  auto* tf = new QFormLayout(train);
  bsz_ = new QDoubleSpinBox;
  bsz_->setObjectName("bsz");
  bsz_->setRange(0.25, 4096);
  bsz_->setDecimals(2);
  bsz_->setSingleStep(1);
  seq_ = new QSpinBox;
  seq_->setRange(1, 1 << 20);
  seq_->setSingleStep(256);
  ci_ = new QSpinBox;
  ci_->setObjectName("ci");
  ci_->setRange(1, 1);
  peak_ = new QDoubleSpinBox;
  peak_->setObjectName("peak");
  peak_->setRange(0.1, 1e6);
  peak_->setDecimals(1);
  peak_->setSuffix(" TFLOPS");
  peak_->setToolTip("achievable peak per GPU; set from the profile's gpu.peak when a profile loads");
  placement_ = new QComboBox;
  placement_->setObjectName("placement");
  for (const std::string& n : preset_names()) placement_->addItem(q(n));
  tf->addRow("micro-batch per GPU (bsz)", bsz_);
  tf->addRow("sequence (seq)", seq_);
  tf->addRow("checkpoint interval (ci)", ci_);
  tf->addRow("achievable peak", peak_);
  tf->addRow("placement (memory and simulate tabs)", placement_);
  v->addWidget(train);
  v->addStretch(1);

  connect(profile_combo_, &QComboBox::activated, this, [this](int i) {
    open_profile(profile_combo_->itemData(i).toString());
  });
  connect(open_button_, &QPushButton::clicked, this, [this] {
    QString path = QFileDialog::getOpenFileName(this, "Open a hardware profile", QString(), "YAML (*.yaml *.yml)");
    if (!path.isEmpty()) open_profile(path);
  });
  connect(form_, &ProfileForm::profile_edited, this, [this](const HardwareProfile& p, const QString& field) {
    session_.profile = p;
    profile_label_->setText(q(p.description) + "\n(what-if: " + field + " edited)");
    refresh();
  });
  connect(model_combo_, &QComboBox::activated, this, &MainWindow::catalogue_chosen);
  for (QSpinBox* s : {layers_, hidden_, heads_})
    connect(s, &QSpinBox::valueChanged, this, &MainWindow::shape_changed);
  connect(bsz_, &QDoubleSpinBox::valueChanged, this, &MainWindow::training_changed);
  connect(peak_, &QDoubleSpinBox::valueChanged, this, &MainWindow::training_changed);
  for (QSpinBox* s : {seq_, ci_}) connect(s, &QSpinBox::valueChanged, this, &MainWindow::training_changed);
  connect(placement_, &QComboBox::currentTextChanged, this, &MainWindow::training_changed);

  auto* scroll = new QScrollArea;
  scroll->setWidget(panel);
  scroll->setWidgetResizable(true);
  scroll->setMinimumWidth(380);
  return scroll;
}

QWidget* MainWindow::build_efficiency_tab() {
  auto* tab = new QWidget;
  auto* grid = new QGridLayout(tab);
  const Fig3Panel panels[] = {Fig3Panel::a_param_grad, Fig3Panel::b_optimizer, Fig3Panel::c_act_ckpt};
  for (Fig3Panel p : panels) {
    charts_[int(p)] = new EfficiencyChart(p);
    charts_[int(p)]->setObjectName(panel_file_stem(p));
  }
  grid->addWidget(charts_[0], 0, 0);
  grid->addWidget(charts_[1], 0, 1);
  grid->addWidget(charts_[2], 1, 0);
  auto* box = new QWidget;
  auto* bv = new QVBoxLayout(box);
  table_title_ = new QLabel;
  table_title_->setObjectName("analysis_title");
  table_title_->setWordWrap(true);
  table_ = new QTableWidget(0, 4);
  table_->setHorizontalHeaderLabels({"state", "from tier", "bandwidth", "efficiency"});
  table_->horizontalHeader()->setSectionResizeMode(QHeaderView::Stretch);
  table_->verticalHeader()->setVisible(false);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  bv->addWidget(table_title_);
  bv->addWidget(table_, 1);
  grid->addWidget(box, 1, 1);
  return tab;
}

void MainWindow::load_into_controls() {
  const QSignalBlocker b1(layers_), b2(hidden_), b3(heads_), b4(bsz_), b5(seq_), b6(ci_), b7(peak_), b8(placement_),
      b9(model_combo_), b10(profile_combo_);
  const Session& s = session_;
  int pi = profile_combo_->findData(q(s.profile.source.rfind("builtin:", 0) == 0 ? s.profile.name : s.profile.source));
  if (pi < 0) {
    profile_combo_->addItem(QFileInfo(q(s.profile.source)).fileName(), q(s.profile.source));
    pi = profile_combo_->count() - 1;
  }
  profile_combo_->setCurrentIndex(pi);
  profile_label_->setText(q(s.profile.description));
  form_->set_profile(s.profile);
  int mi = model_combo_->findText(q(s.model.name));
  model_combo_->setCurrentIndex(mi >= 0 ? mi : model_combo_->findText(kCustom));
  layers_->setValue(s.model.layers);
  hidden_->setValue(int(s.model.hidden));
  heads_->setValue(s.model.heads);
  ci_->setRange(1, s.model.layers);
  bsz_->setValue(s.config.bsz);
  seq_->setValue(int(s.config.seq));
  ci_->setValue(s.config.ci);
  peak_->setValue(s.peak_flops_per_s / kTera);
  placement_->setCurrentText(q(s.placement));
}

bool MainWindow::open_profile(const QString& name_or_path) {
  Result<HardwareProfile> p = load_profile(name_or_path.toStdString());
  if (!p) {
    report_error_(this, q(p.error()));
    load_into_controls();  // the combo goes back to the profile still in use
    return false;
  }
  session_.profile = *p;
  loaded_profile_ = *p;
  session_.peak_flops_per_s = p->gpu_peak_flops_per_s;
  load_into_controls();
  refresh();
  return true;
}

void MainWindow::training_changed() {
  session_.config.bsz = bsz_->value();
  session_.config.seq = seq_->value();
  session_.config.ci = ci_->value();
  session_.peak_flops_per_s = peak_->value() * kTera;
  session_.placement = placement_->currentText().toStdString();
  refresh();
}

void MainWindow::catalogue_chosen(int index) {
  if (model_combo_->itemText(index) == kCustom) return shape_changed();
  Result<CatalogueEntry> e = find_catalogue_entry(model_combo_->itemText(index).toStdString());
  if (!e) return;
  session_.model = e->spec;
  session_.config.seq = e->spec.seq;
  session_.config.ci = std::min(session_.config.ci, e->spec.layers);
  load_into_controls();
  refresh();
}

void MainWindow::shape_changed() {
  Result<ModelSpec> m = model_from_shape(layers_->value(), hidden_->value(), heads_->value(), seq_->value());
  if (!m) {
    model_label_->setStyleSheet("color:#d62728");
    model_label_->setText(q(m.error()) + "; kept " + q(session_.model.name));
    return;
  }
  session_.model = *m;
  session_.config.ci = std::min(session_.config.ci, m->layers);
  {
    const QSignalBlocker b(model_combo_), c(ci_);
    model_combo_->setCurrentIndex(model_combo_->findText(kCustom));
    ci_->setRange(1, m->layers);
    ci_->setValue(session_.config.ci);
  }
  refresh();
}

void MainWindow::refresh() {
  const Session& s = session_;
  model_label_->setStyleSheet("");
  const double params = analysis_param_count(s.model);
  const std::string counted = s.model.paper_gpt() ? "Eq. 1" : "every parameter; " + s.model.kind_words();
  model_label_->setText(QString("%1: %2 parameters (%3), model states %4 (Eq. 2)")
                            .arg(q(s.model.name), q(format_count(params)), q(counted), q(format_bytes(20.0 * params))));
  for (EfficiencyChart* c : charts_) c->set_data(panel_data(s, c->panel()));
  fill_table();
  statusBar()->showMessage(QString("profile %1 (%2), %3 GPUs; model %4; bsz %5, seq %6, ci %7, peak %8")
                               .arg(q(s.profile.name), q(s.profile.source))
                               .arg(s.profile.total_gpus())
                               .arg(q(s.model.name))
                               .arg(s.config.bsz)
                               .arg(s.config.seq)
                               .arg(s.config.ci)
                               .arg(q(format_flops_rate(s.peak_flops_per_s))));
  plan_->set_session(s);
  sim_->set_session(s);
  memory_timer_->start();
}

void MainWindow::fill_table() {
  const Session& s = session_;
  Result<TrainingConfig> c = validate(s.config, s.model.layers);
  table_->setRowCount(0);
  if (!c) {
    table_title_->setText(q(c.error()));
    return;
  }
  Analysis a = analyze(s.model, s.config, s.profile, 0);
  table_title_->setText(QString("<b>memwall analyze</b> on %1 over %2 GPUs: each state offloaded alone, Eq. 6 at the "
                                "peak for hidden %3 (%4). Hover a row for how its bandwidth is derived. %5")
                            .arg(q(s.profile.name))
                            .arg(a.gpus)
                            .arg(s.model.hidden)
                            .arg(q(format_flops_rate(a.peak_flops_per_s)))
                            .arg(q(markers_note(s)).toHtmlEscaped()));
  for (const StateTierEfficiency& e : a.efficiencies) {
    const int r = table_->rowCount();
    table_->insertRow(r);
    const QStringList cells = {to_string(e.state), q(e.tier), q(format_bandwidth(e.bw_Bps)),
                               QString::number(100.0 * e.efficiency, 'f', 1) + " %"};
    for (int col = 0; col < cells.size(); ++col) {
      auto* item = new QTableWidgetItem(cells[col]);
      item->setToolTip(q(e.basis));
      table_->setItem(r, col, item);
    }
  }
}

void MainWindow::start_memory_job() {
  if (memory_watcher_.isRunning()) {
    memory_pending_ = true;
    return;
  }
  memory_pending_ = false;
  memory_->set_busy(true);
  memory_watcher_.setFuture(QtConcurrent::run([s = session_] {
    MemoryOutcome out;
    Result<MemoryData> d = memory_data(s);
    out.ok = d.ok();
    if (d) {
      out.data = *d;
      out.heading = memory_heading(s, *d);
    } else {
      out.error = q(d.error());
    }
    return out;
  }));
}

void MainWindow::memory_job_done() {
  if (memory_pending_) return start_memory_job();  // the result is already stale
  memory_->set_busy(false);
  const MemoryOutcome out = memory_watcher_.result();
  if (out.ok) memory_->set_data(out.data, out.heading);
  else memory_->set_error(out.error);
}

void MainWindow::wait_for_memory() {
  if (memory_timer_->isActive()) {
    memory_timer_->stop();
    start_memory_job();
  }
  while (memory_watcher_.isRunning() || memory_pending_ || memory_->busy())
    QCoreApplication::processEvents(QEventLoop::AllEvents, 20);
}

}  // namespace memwall::gui
