#!/usr/bin/env bash
# setup.sh [run|test] [args...]
#   run  (default): install what is missing, build, run the main job: memwall analyze (args pass
#                   through), then memwall reproduce (the paper's evaluation, simulated, into results/sim)
#   test          : install what is missing, build, run every test through CTest; then the same
#                   suite with ASan+UBSan and the libFuzzer targets for 60 s each (clang, build-fuzz/,
#                   CUDA off), and the threaded parts' tests with TSan (build-tsan/)
# Idempotent and incremental: packages already installed are not reinstalled, the build folder
# (build/) is reused, so a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")"
mode=${1:-run}
[ $# -gt 0 ] && shift

# Debian packages memwall needs (DESIGN.md, "Dependencies").
packages=(
  cmake ninja-build g++ pkg-config
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev libboost-graph-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libsimgrid-dev liburing-dev libopenblas-dev libopenblas-openmp-dev libopenmpi-dev openmpi-bin
  qt6-base-dev qt6-charts-dev libqt6opengl6-dev xvfb xauth
  fio python3-torch python3-numpy
  clang libclang-rt-14-dev e2fsprogs stress-ng
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo="sudo"
  echo "setup.sh: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ ! -f build/CMakeCache.txt ]; then
  # Unity builds (8 sources per compiler run): CLI11, nlohmann/json and gtest are compiled once per
  # batch instead of once per file, which halves a clean build on 2 cores. Plain `cmake -S . -B b`
  # builds file by file, so both must compile (a name two files define twice fails the unity one).
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8
fi
cmake --build build --parallel "$(nproc)"

case "$mode" in
  run) ./build/memwall analyze "$@" && exec ./build/memwall reproduce -o results/sim ;;
  test)
    (cd build && ctest --output-on-failure --parallel "$(nproc)" "$@")
    # Sanitizers (tests/sanitizers/README.md). build-fuzz/ is clang with ASan and UBSan (and
    # libFuzzer's coverage) in every library and program: the whole suite runs there too, but the
    # tests tests/sanitizers/asan_exclude.txt names with its reason, and each fuzz target for 60 s.
    # A finding (leaks included; third-party ones suppressed in lsan.supp) fails its test.
    if [ ! -f build-fuzz/CMakeCache.txt ]; then
      cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
        -DCMAKE_CXX_COMPILER=clang++ -DMEMWALL_FUZZ=ON -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8 > /dev/null
    fi
    cmake --build build-fuzz --parallel "$(nproc)"
    cc -shared -fPIC -O2 -o build-fuzz/no_dlclose.so tests/sanitizers/no_dlclose.c
    exclude=$(sed -e 's/[[:space:]]*#.*//' -e '/^$/d' tests/sanitizers/asan_exclude.txt | paste -sd'|')
    (cd build-fuzz && env ASAN_OPTIONS=detect_leaks=1:exitcode=86 \
      LSAN_OPTIONS="suppressions=$PWD/../tests/sanitizers/lsan.supp:print_suppressions=0" \
      UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=86 LD_PRELOAD="$PWD/no_dlclose.so" \
      ctest --output-on-failure --parallel "$(nproc)" -E "$exclude")
    # ThreadSanitizer on the threaded parts: the io engine's rings and workers, the CPU Adam worker
    # pool, the engine's dispatcher with its copy streams, io and host-lane threads (build-tsan/,
    # only these three test programs). OpenMP and OpenBLAS run one thread there: their runtimes are
    # not instrumented, so TSan would report their own synchronisation.
    if [ ! -f build-tsan/CMakeCache.txt ]; then
      cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
        -DCMAKE_CXX_COMPILER=clang++ -DMEMWALL_SANITIZE=thread -DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8 > /dev/null
    fi
    cmake --build build-tsan --parallel "$(nproc)" --target test_io test_cpu_adam test_engine
    tsan() {  # tsan PROGRAM: one test program under TSan, its output to build-tsan/PROGRAM.log
      env TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:ignore_noninstrumented_modules=1:suppressions=$PWD/tests/sanitizers/tsan.supp" \
        OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "build-tsan/tests/exec/$1" --gtest_brief=1 \
        --gtest_filter="-$(sed -e 's/[[:space:]]*#.*//' -e '/^$/d' tests/sanitizers/tsan_exclude.txt | paste -sd':')" \
        > "build-tsan/$(basename "$1").log" 2>&1
    }
    # Two at a time on 2 cores: the engine's tests (the longest) beside the io engine's and CPU Adam's.
    tsan engine/test_engine & engine=$!
    status=0
    tsan io/test_io || status=1
    tsan adam/test_cpu_adam || status=1
    wait $engine || status=1
    for t in test_io test_cpu_adam test_engine; do
      echo "ThreadSanitizer: $t"
      cat "build-tsan/$t.log"
    done
    exit $status ;;
  *) echo "setup.sh: unknown mode \"$mode\" (expected run or test)" >&2; exit 2 ;;
esac
