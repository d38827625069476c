#!/usr/bin/env bash
# shared_folders.sh MEMWALL: runs that share a folder with other runs and with planted files stay
# correct (issue 30). Each case failed before the fix:
#   - a second run on a folder a run holds (--nvme-dir, --save) is refused at once with the
#     holder's pid, and the first run's losses are those of a run alone; a lock file left by a dead
#     process is taken over;
#   - a symlink planted where memwall writes (a swap file, a checkpoint shard's temporary, the
#     manifest's temporary, a step folder, a trace) is refused naming the path, and its target is
#     untouched;
#   - a checkpoint manifest out of range (iteration 1e20 or -1, adam_step -5, latest pointing
#     outside the folder) is refused naming the file and field;
#   - a save that fails removes its partial step folder.
set -euo pipefail
mw=$1
dir=$(mktemp -d)
first=""
cleanup() {  # a first run left stopped by a failed check is continued and ended
  if [ -n "$first" ]; then kill -CONT "$first" 2>/dev/null || true; kill "$first" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT
cfg="$dir/run.yaml"
printf 'layers: 2\nhidden: 32\nheads: 4\nseq: 16\nbsz: 2\nsteps: 3\nlr: 3e-3\n' >"$cfg"
fail() { echo "FAIL: $*"; exit 1; }
losses() { python3 -c 'import json,sys; print(" ".join(repr(s["loss"]) for s in json.loads(sys.stdin.read().splitlines()[-1])["steps"]))'; }
expect_refusal() {  # expect_refusal REGEX ARGS...: exit 2 and one line matching REGEX
  local re=$1
  shift
  local out rc=0
  out=$("$mw" run --config "$cfg" "$@" 2>&1 >/dev/null) || rc=$?
  [ "$rc" = 2 ] || fail "exit $rc (expected 2) for $*: $out"
  echo "$out" | grep -Eq "$re" || fail "for $*: got '$out', expected /$re/"
}

# ---- two runs, one folder ----
mkdir -p "$dir/sw" "$dir/sw2"
alone=$("$mw" run --config "$cfg" --strategy zero_inf_nvme --nvme-dir "$dir/sw" --json | losses)
MEMWALL_SAVE_PAUSE_S=6 "$mw" run --config "$cfg" --strategy zero_inf_nvme --nvme-dir "$dir/sw" --save "$dir/ck" \
  --json >"$dir/first.json" &
first=$!
for _ in $(seq 1 300); do [ -e "$dir/ck/step-00000003/rank0000.optim32" ] && break; sleep 0.05; done
[ -e "$dir/ck/step-00000003/rank0000.optim32" ] || fail "the first run never reached its save"
# held where it is while the second runs start, however long a loaded machine takes to start them
# (with only the 6 s pause, a second run that took longer found the folders free)
kill -STOP "$first"
expect_refusal "^memwall run: --nvme-dir $dir/sw: in use by another memwall run \\(pid $first\\); give each run its own folder" \
  --strategy zero_inf_nvme --nvme-dir "$dir/sw"
expect_refusal "^memwall run: --save $dir/ck: in use by another memwall run \\(pid $first\\)" \
  --strategy zero_inf_nvme --nvme-dir "$dir/sw2" --save "$dir/ck"
kill -CONT "$first"
wait "$first" || fail "the first run failed"
[ "$(losses <"$dir/first.json")" = "$alone" ] || fail "the first run's losses $(losses <"$dir/first.json") != alone $alone"
[ -z "$(ls -A "$dir/sw")" ] || fail "the swap folder keeps $(ls -A "$dir/sw")"
echo "a second run on a held --nvme-dir or --save folder is refused with the holder's pid; the first run's losses are a lone run's"
echo 999999 >"$dir/sw/.memwall-lock-rank0000"  # a lock file of a dead process
[ "$("$mw" run --config "$cfg" --strategy zero_inf_nvme --nvme-dir "$dir/sw" --json | losses)" = "$alone" ] ||
  fail "a stale lock file was not taken over"
echo "a lock file left by a dead process is taken over"

# ---- planted symlinks ----
printf 'precious\n' >"$dir/victim.txt"
untouched() { [ "$(cat "$dir/victim.txt")" = precious ] || fail "the link's target was written through ($1)"; }
ln -s "$dir/victim.txt" "$dir/sw/rank0000.param16.swap"
expect_refusal "^memwall run: --nvme-dir: open $dir/sw/rank0000.param16.swap: is a symbolic link; memwall does not write through links" \
  --strategy zero_inf_nvme --nvme-dir "$dir/sw"
untouched swap
rm -f "$dir/sw/rank0000.param16.swap"
for planted in step-00000003/rank0000.optim32.tmp step-00000003/manifest.json.tmp latest.tmp; do
  rm -rf "$dir/ck2" && mkdir -p "$dir/ck2/step-00000003"
  ln -s "$dir/victim.txt" "$dir/ck2/$planted"
  out=$("$mw" run --config "$cfg" --strategy zero_inf_nvme --nvme-dir "$dir/sw" --save "$dir/ck2" 2>&1 >/dev/null) &&
    fail "a link at $planted was written through"
  grep -q "$dir/ck2/$planted: is a symbolic link" <<<"$out" || fail "for a link at $planted: $out"
  untouched "$planted"
done
rm -rf "$dir/ck2" && mkdir -p "$dir/ck2" "$dir/elsewhere"
ln -s "$dir/elsewhere" "$dir/ck2/step-00000003"
out=$("$mw" run --config "$cfg" --strategy zero_inf_nvme --nvme-dir "$dir/sw" --save "$dir/ck2" 2>&1 >/dev/null) &&
  fail "a linked step folder was written into"
grep -q "$dir/ck2/step-00000003: is a symbolic link" <<<"$out" || fail "for a linked step folder: $out"
[ -z "$(ls -A "$dir/elsewhere")" ] || fail "files written through a linked step folder"
ln -s "$dir/victim.txt" "$dir/t.json"
expect_refusal "^memwall run: --trace: $dir/t.json: is a symbolic link" --strategy zero_inf_cpu --trace "$dir/t.json"
untouched trace
echo "links planted at a swap file, a shard's and the manifest's temporaries, latest's temporary, a step folder and a trace: refused by path, targets untouched"

# ---- manifests out of range ----
ck="$dir/ck"
m="$ck/step-00000003/manifest.json"
cp "$m" "$dir/manifest.good"
edit() { python3 - "$m" "$1" "$2" <<'EOF'
import json, sys
path, key, value = sys.argv[1:]
text = open(path).read()
j = json.loads(text)
j[key] = "@@"
open(path, "w").write(json.dumps(j).replace('"@@"', value))
EOF
}
for bad in "iteration 99999999999999999999" "iteration -1" "adam_step -5" "adam_step 4" "data_rng -1"; do
  set -- $bad
  cp "$dir/manifest.good" "$m"
  edit "$1" "$2"
  expect_refusal "^memwall run: $m: $1: expected .*, got" --strategy zero_inf_nvme --nvme-dir "$dir/sw" --steps 5 --resume "$ck"
done
cp "$dir/manifest.good" "$m"
echo "../../etc" >"$ck/latest"
expect_refusal "^memwall run: $ck/latest: expected the name of a step folder" --strategy zero_inf_nvme --nvme-dir "$dir/sw" --steps 5 --resume "$ck"
echo "step-00000003" >"$ck/latest"
[ -n "$("$mw" run --config "$cfg" --strategy zero_inf_nvme --nvme-dir "$dir/sw" --steps 5 --resume "$ck" --json | losses)" ] ||
  fail "the good manifest no longer resumes"
echo "manifests with iteration 1e20 or -1, adam_step -5 or past the iteration, data_rng -1, latest outside the folder: refused by file and field"

# ---- a failed save leaves no partial step folder ----
rm -rf "$dir/ck3" && mkdir -p "$dir/ck3"
ln -s "$dir/victim.txt" "$dir/ck3/latest.tmp"  # the save fails at its last file, after the step's shards
"$mw" run --config "$cfg" --strategy zero_inf_nvme --nvme-dir "$dir/sw" --save "$dir/ck3" >/dev/null 2>&1 &&
  fail "the save did not fail"
[ ! -e "$dir/ck3/step-00000003" ] || fail "the failed save left $(ls "$dir/ck3/step-00000003")"
echo "a save that fails removes its partial step folder"
