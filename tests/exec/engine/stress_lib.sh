# stress_lib.sh, sourced by the busy-machine tests: a temporary folder $dir and `start_stress N`
# (stress-ng --cpu N in the background), both cleaned up on exit, whatever the exit.
command -v stress-ng >/dev/null || { echo "FAIL: stress-ng is not installed (setup.sh installs it)"; exit 1; }
dir=$(mktemp -d)
stress_pid=
cleanup() {
  [ -n "$stress_pid" ] && kill "$stress_pid" 2>/dev/null && wait "$stress_pid" 2>/dev/null
  rm -rf "$dir"
}
trap cleanup EXIT
start_stress() {
  stress-ng --cpu "$1" --timeout 300 >/dev/null 2>&1 &
  stress_pid=$!
  sleep 1
}
