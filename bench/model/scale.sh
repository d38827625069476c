#!/usr/bin/env bash
# scale.sh [MEMWALL] [LAYERS...]: time and peak memory of `memwall schedule`, `simulate` and `plan`
# as layers grow to the cap (issue 30, item 6), against the smallest size in the same run: the
# "per layer" column is (seconds / layers) relative to the first row, so 1.0 everywhere is linear.
# The schedule-size cap (model/training_config.cpp) promises a schedule within an eighth of this
# machine's memory; the last column is peak RSS against that budget. A benchmark, not a test: run
# it by hand (32000 layers takes a minute). Defaults: ./build/memwall 4000 8000 16000 32000.
set -euo pipefail
mw=${1:-$(cd "$(dirname "$0")/../.." && pwd)/build/memwall}
shift || true
layers=("$@")
[ ${#layers[@]} -gt 0 ] || layers=(4000 8000 16000 32000)
[ -x "$mw" ] || { echo "$0: $mw: not built (cmake --build build)" >&2; exit 2; }
budget_kib=$(awk '/^MemTotal:/ {print int($2 / 8)}' /proc/meminfo)
model="--hidden 1K --heads 16 --place act_ckpt=cpu"  # act_ckpt on the CPU so every size fits the GPU
printf "%-9s %7s %9s %10s %10s %12s\n" command layers seconds "per layer" "peak RSS" "of budget"
for cmd in schedule simulate plan; do
  first=""
  for l in "${layers[@]}"; do
    args="$model"
    [ "$cmd" = plan ] && args="--hidden 1K --heads 16"  # the planner chooses the placement itself
    /usr/bin/time -f "%e %M" -o /tmp/scale.$$ "$mw" "$cmd" --layers "$l" $args >/dev/null 2>&1 || true
    read -r s kib </tmp/scale.$$
    per=$(python3 -c "print($s / $l)")
    [ -n "$first" ] || first=$per
    printf "%-9s %7d %9.2f %10.2f %8.0f MB %11.0f %%\n" "$cmd" "$l" "$s" "$(python3 -c "print($per / $first)")" \
      "$(python3 -c "print($kib / 1024)")" "$(python3 -c "print(100 * $kib / $budget_kib)")"
  done
done
rm -f /tmp/scale.$$
echo "budget: an eighth of this machine's memory, $((budget_kib / 1024)) MB (the cap's promise)"
