#!/usr/bin/env bash
# lavaflow-viewer as an integration test, on real processes and real drivers (lavapipe + llvmpipe
# in CI). Usage: viewer.sh CASE VIEWER PNG_CHECK [XVFB_RUN]
#   spawn-egl     the default run headless: compute process + viewer, screenshot checked pixel by pixel
#   spawn-window  the same in a GLFW window under Xvfb
#   shm           the shared-memory route (frames uploaded), screenshot checked
#   start-order   viewer first, then the producer; producer first, then the viewer; each side
#                 leaving is reported by the other, which exits 0
#   wait          viewer --wait across two producers, one killed with SIGKILL
# Exit 77 (skip) when the viewer reports no usable Vulkan/GL device.
set -uo pipefail
case_name=$1 viewer=$2 png_check=$3 xvfb=${4:-}
[[ $xvfb == *NOTFOUND ]] && xvfb=""
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
cd "$work"
fail() { echo "FAILED: $*"; for f in "$work"/*.log; do [ -f "$f" ] && { echo "--- $f"; cat "$f"; }; done; exit 1; }
run() {  # run NAME CMD...: exit status of CMD, 77 passed through
  "${@:2}" > "$1.log" 2>&1
  local rc=$?
  [ $rc -eq 77 ] && { cat "$1.log"; echo "LAVAFLOW-SKIP: lavaflow-viewer: $(grep -h FAILED "$1.log" | head -1)"; exit 77; }
  return $rc
}
expect() { grep -q -- "$2" "$1.log" || fail "$1.log lacks \"$2\""; }
ch="viewer-test-$$"

case $case_name in
  spawn-egl)
    run v "$viewer" --headless --frames 40 --fps 0 --screenshot shot.png || fail "viewer exited $?"
    expect v "screenshot verified"
    "$png_check" shot.png || fail "png_check"
    ;;
  spawn-window)
    [ -n "$xvfb" ] || { echo "LAVAFLOW-SKIP: xvfb-run not installed"; exit 77; }
    run v "$xvfb" -a "$viewer" --frames 40 --fps 0 --screenshot shot.png || fail "viewer exited $?"
    expect v "window on"
    expect v "screenshot verified"
    "$png_check" shot.png || fail "png_check"
    ;;
  shm)
    run v "$viewer" --headless --frames 20 --fps 0 --transport shm --screenshot shot.png || fail "viewer exited $?"
    expect v "route shm"
    expect v "upload (one copy per frame)"
    "$png_check" shot.png || fail "png_check"
    ;;
  start-order)
    # Viewer first: it waits; the producer sends 30 frames and leaves; the viewer says so, exits 0.
    "$viewer" --channel "$ch-a" --headless --timeout 30 > va.log 2>&1 &
    vpid=$!
    sleep 0.5
    run pa "$viewer" produce --channel "$ch-a" --frames 30 --fps 200 || fail "producer exited $?"
    wait $vpid || fail "viewer (started first) exited $?"
    expect va "went away"
    expect pa "done: 30 frames"
    # Producer first: the viewer takes 15 frames and closes; the producer says so, exits 0.
    "$viewer" produce --channel "$ch-b" --fps 200 > pb.log 2>&1 &
    ppid=$!
    sleep 0.5
    run vb "$viewer" --channel "$ch-b" --headless --frames 15 --screenshot b.png || fail "viewer exited $?"
    wait $ppid || fail "producer (started first) exited $?"
    expect pb "the viewer went away"
    "$png_check" b.png || fail "png_check"
    ;;
  wait)
    "$viewer" --channel "$ch" --headless --wait --frames 90 --screenshot w.png > v.log 2>&1 &
    vpid=$!
    "$viewer" produce --channel "$ch" --fps 60 > p1.log 2>&1 &
    p1=$!
    for _ in $(seq 100); do grep -q "zero copy\|upload" v.log 2>/dev/null && break; sleep 0.1; done
    sleep 0.5  # about 30 of the 90 frames
    kill -9 $p1
    wait $p1 2>/dev/null
    # A new producer takes over the name; the waiting viewer picks it up and finishes with it.
    run p2 "$viewer" produce --channel "$ch" --fps 60 --timeout 30 || fail "second producer exited $?"
    wait $vpid || fail "viewer exited $?"
    expect v "went away"
    [ "$(grep -c "producer pid" v.log)" -eq 2 ] || fail "the viewer did not see two producers"
    "$png_check" w.png || fail "png_check"
    ;;
  *) echo "unknown case $case_name"; exit 2 ;;
esac
echo "viewer $case_name: OK"
