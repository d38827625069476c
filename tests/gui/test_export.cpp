// `memwall-gui --export DIR` with no display at all: four PNGs of the requested size that are not
// blank (many colours, a fair share of non-white pixels); a broken profile exits 2 with the
// CLI's one-line message and writes nothing.
#include <QDir>
#include <QFile>
#include <QImage>
#include <QProcess>
#include <QSet>
#include <QTemporaryDir>
#include <QtTest/QtTest>

class ExportTest : public QObject {
  Q_OBJECT

  static QProcessEnvironment no_display() {
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.remove("DISPLAY");
    env.remove("WAYLAND_DISPLAY");
    env.remove("QT_QPA_PLATFORM");  // the program must choose offscreen itself
    return env;
  }

 private slots:
  void renders_the_pngs_headless() {
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    QProcess p;
    p.setProcessEnvironment(no_display());
    p.start(MEMWALL_GUI_BIN, {"--export", dir.path(), "--profile", "dgx2", "--model", "fig2a-1T"});
    QVERIFY(p.waitForFinished(60000));
    QVERIFY2(p.exitCode() == 0, p.readAllStandardError().constData());
    for (const char* name : {"fig3a.png", "fig3b.png", "fig3c.png", "memory.png", "timeline.png", "window-efficiency.png",
                             "window-memory.png"}) {
      QImage img(QDir(dir.path()).filePath(name));
      QVERIFY2(!img.isNull(), name);
      QCOMPARE(img.size(), QSize(1000, 650));
      QSet<QRgb> colours;
      qint64 non_white = 0;
      for (int y = 0; y < img.height(); ++y)
        for (int x = 0; x < img.width(); ++x) {
          const QRgb c = img.pixel(x, y);
          colours.insert(c);
          if (qRed(c) < 235 || qGreen(c) < 235 || qBlue(c) < 235) ++non_white;
        }
      const double share = double(non_white) / (img.width() * img.height());
      QVERIFY2(colours.size() > 50, qPrintable(QString("%1: %2 colours").arg(name).arg(colours.size())));
      QVERIFY2(share > 0.02 && share < 0.9, qPrintable(QString("%1: %2 of pixels not white").arg(name).arg(share)));
    }
  }

  void custom_size_and_model() {
    QTemporaryDir dir;
    QProcess p;
    p.setProcessEnvironment(no_display());
    p.start(MEMWALL_GUI_BIN, {"--export", dir.path(), "--layers", "4", "--hidden", "8K", "--heads", "64", "--bsz", "4",
                              "--size", "640x400", "--profile", "workstation"});
    QVERIFY(p.waitForFinished(60000));
    QVERIFY2(p.exitCode() == 0, p.readAllStandardError().constData());
    QCOMPARE(QImage(QDir(dir.path()).filePath("fig3b.png")).size(), QSize(640, 400));
  }

  void broken_profile_exits_2_with_one_line() {
    QTemporaryDir dir;
    QProcess p;
    p.setProcessEnvironment(no_display());
    p.start(MEMWALL_GUI_BIN, {"--export", dir.path() + "/out", "--profile", MEMWALL_GUI_FIXTURES "/broken_profile.yaml"});
    QVERIFY(p.waitForFinished(60000));
    QCOMPARE(p.exitCode(), 2);
    const QString err = QString::fromUtf8(p.readAllStandardError());
    QVERIFY2(err.contains(QRegularExpression("memwall-gui: .*broken_profile.yaml:25: nvme.read: expected a bandwidth")),
             qPrintable(err));
    QVERIFY(!QDir(dir.path() + "/out").exists());
  }

  // Issue 30: an empty --export opened a window and never exited; a folder that cannot be made
  // failed only after the work. Both are bad input: exit 2, one line, no window, nothing written.
  void bad_export_folder_exits_2_with_one_line() {
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    QFile file(dir.path() + "/a-file");
    QVERIFY(file.open(QIODevice::WriteOnly));
    file.close();
    const QList<QPair<QString, QString>> cases = {
        {"", "--export: expected a folder, got an empty name"},
        {dir.path() + "/no/such", "--export: .*/no/such: its folder .*/no does not exist \\(make it first\\)"},
        {dir.path() + "/a-file", "--export: .*/a-file: not a folder"},
    };
    for (const auto& [target, message] : cases) {
      QProcess p;
      p.setProcessEnvironment(no_display());
      p.start(MEMWALL_GUI_BIN, {"--export", target, "--profile", "workstation"});
      QVERIFY2(p.waitForFinished(30000), qPrintable("--export '" + target + "' did not exit"));
      QCOMPARE(p.exitCode(), 2);
      const QString err = QString::fromUtf8(p.readAllStandardError());
      QVERIFY2(err.count('\n') == 1, qPrintable(err));
      QVERIFY2(err.contains(QRegularExpression("^memwall-gui: " + message + "\n$")), qPrintable(err));
    }
    QCOMPARE(QDir(dir.path()).entryList(QDir::NoDotAndDotDot | QDir::AllEntries), QStringList{"a-file"});
  }
};

QTEST_GUILESS_MAIN(ExportTest)
#include "test_export.moc"
