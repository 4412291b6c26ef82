#!/usr/bin/env bash
# Runs one README example; exit 77 (what the adapter examples return when this machine lacks the
# device) becomes a visible skip that names the example and its reason.
name=$1
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
if [ "$rc" -eq 77 ]; then
  echo "LAVAFLOW-SKIP: README example $name: ${out:-no device}"
fi
exit "$rc"
