#!/usr/bin/env bash
# run_fuzz.sh TARGET SECONDS SEEDS OUT: runs one libFuzzer target for SECONDS from the seed corpus
# SEEDS, keeping new inputs and any crash under OUT (never in SEEDS). Fails on any finding; the
# reproducer is OUT/crash-* (run TARGET on it to see the report).
set -u
target=$1 seconds=$2 seeds=$3 out=$4
dict=$(dirname "$0")/yaml.dict
mkdir -p "$out/corpus"
# leaks count: a loader that leaks on some input is a finding like any other
"$target" "$out/corpus" "$seeds" -max_total_time="$seconds" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
  -dict="$dict" -artifact_prefix="$out/" -print_final_stats=1 2>"$out/log.txt"
rc=$?
grep -E "^(stat::number_of_executed_units|stat::new_units_added|#[0-9]+ +DONE)" "$out/log.txt" | tr '\n' ' '
echo
if [ $rc -ne 0 ]; then
  grep -E "ERROR|SUMMARY|fuzz check failed|Test unit written" "$out/log.txt" | head -20
  exit 1
fi
