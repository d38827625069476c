#!/usr/bin/env bash
# setup.sh [run|test] [args...]
#   run  (default): install what is missing, build, run the main job: memwall analyze (args pass
#                   through), then memwall reproduce (the paper's evaluation, simulated, into results/sim)
#   test          : install what is missing, build, run every test through CTest, then build the
#                   libFuzzer targets with clang (build-fuzz/, CUDA off) and run each for 60 s
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
  clang libclang-rt-14-dev e2fsprogs
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
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build build --parallel "$(nproc)"

case "$mode" in
  run) ./build/memwall analyze "$@" && exec ./build/memwall reproduce -o results/sim ;;
  test)
    (cd build && ctest --output-on-failure --parallel "$(nproc)" "$@")
    # The YAML loaders and the unit parser under libFuzzer with ASan and UBSan (tests/fuzz): a
    # finding fails the test command, its reproducer kept under build-fuzz/tests/fuzz/found/.
    if [ ! -f build-fuzz/CMakeCache.txt ]; then
      cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
        -DCMAKE_CXX_COMPILER=clang++ -DMEMWALL_FUZZ=ON > /dev/null
    fi
    cmake --build build-fuzz --parallel "$(nproc)" --target fuzz_profile fuzz_model fuzz_placement fuzz_plan \
      fuzz_run_config fuzz_units
    cd build-fuzz && exec ctest --output-on-failure --parallel "$(nproc)" -R '^fuzz[.]' ;;
  *) echo "setup.sh: unknown mode \"$mode\" (expected run or test)" >&2; exit 2 ;;
esac
