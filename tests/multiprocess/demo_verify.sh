#!/usr/bin/env bash
# lavaflow-demo verifies every frame: a clean run passes, and a run whose producer flips one byte of
# one frame after writing it fails naming that frame. VERIFY is cpu, or gpu (CUDA kernels with the
# GPU-ordered hand-off: a visible skip where this machine cannot run them).
#   demo_verify.sh DEMO VERIFY
set -uo pipefail
demo=$1 verify=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$demo" --count 200 --size 65536 --verify "$verify" > "$out" 2>&1
rc=$?
if [ "$verify" = gpu ] && [ $rc -ne 0 ] && grep -qE "cannot share a timeline semaphore|no CUDA|CUDA driver|built without CUDA|cudaErrorNoDevice|cudaErrorInsufficientDriver" "$out"; then
  echo "LAVAFLOW-SKIP: --verify gpu cannot run here: $(grep -m1 FAILED "$out")"
  exit 77
fi
if [ $rc -ne 0 ] || ! grep -q "lavaflow-demo: OK" "$out"; then
  echo "clean run with --verify $verify failed (exit $rc):"; cat "$out"; exit 1
fi
grep -q "verified by" "$out" || { echo "the summary does not say who verified the frames:"; cat "$out"; exit 1; }
if [ "$verify" = gpu ] && ! grep -q "verified by CUDA" "$out"; then
  echo "--verify gpu ran but the frames were not verified on the GPU:"; cat "$out"; exit 1
fi
"$demo" --count 200 --size 65536 --verify "$verify" --corrupt-frame 37 > "$out" 2>&1
rc=$?
if [ $rc -ne 1 ] || ! grep -qE "(message|frame) 37 is corrupt" "$out"; then
  echo "a corrupted frame 37 was not reported as such (exit $rc):"; cat "$out"; exit 1
fi
echo "OK: clean run verified by $(grep -o 'verified by [^(;]*' "$out" | head -1 || true); frame 37's flipped byte reported"
