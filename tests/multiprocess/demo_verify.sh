#!/usr/bin/env bash
# lavaflow-demo verifies every frame: a clean run passes, and a run whose producer flips one byte of
# one frame after writing it fails naming that frame. VERIFY is cpu, or cuda or vulkan (kernels or
# compute shaders with the GPU-ordered hand-off: a visible skip where this machine cannot run them).
#   demo_verify.sh DEMO VERIFY
set -uo pipefail
demo=$1 verify=$2
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$demo" --count 200 --size 65536 --verify "$verify" > "$out" 2>&1
rc=$?
if [ "$verify" != cpu ] && [ $rc -ne 0 ] && grep -qE "cannot share a timeline semaphore|no CUDA|CUDA driver|built without|cudaErrorNoDevice|cudaErrorInsufficientDriver" "$out"; then
  echo "LAVAFLOW-SKIP: --verify $verify cannot run here: $(grep -m1 FAILED "$out")"
  exit 77
fi
if [ $rc -ne 0 ] || ! grep -q "lavaflow-demo: OK" "$out"; then
  echo "clean run with --verify $verify failed (exit $rc):"; cat "$out"; exit 1
fi
grep -q "verified by" "$out" || { echo "the summary does not say who verified the frames:"; cat "$out"; exit 1; }
want=""
[ "$verify" = cuda ] && want="verified by CUDA"
[ "$verify" = vulkan ] && want="Vulkan compute shader, every word"
if [ -n "$want" ] && ! grep -q "$want" "$out"; then
  echo "--verify $verify ran but the frames were not verified that way:"; cat "$out"; exit 1
fi
"$demo" --count 200 --size 65536 --verify "$verify" --corrupt-frame 37 > "$out" 2>&1
rc=$?
if [ $rc -ne 1 ] || ! grep -qE "(message|frame) 37 is corrupt" "$out"; then
  echo "a corrupted frame 37 was not reported as such (exit $rc):"; cat "$out"; exit 1
fi
echo "OK: clean run verified by $(grep -o 'verified by [^(;]*' "$out" | head -1 || true); frame 37's flipped byte reported"
