#!/usr/bin/env bash
# The README's channel example as two processes: consumer started first, producer second, in a
# private runtime directory (the examples use the default rendezvous directory). Passes when the
# consumer received every message and both exited 0; leaves nothing behind.
set -euo pipefail
producer=$1 consumer=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
chmod 700 "$dir"
export XDG_RUNTIME_DIR=$dir
timeout 60 "$consumer" >"$dir/consumer.out" &
cpid=$!
timeout 60 "$producer"
wait "$cpid"
cat "$dir/consumer.out"
grep -qx "received 100 messages" "$dir/consumer.out"
leftover=$(find "$dir/lavaflow" -mindepth 1 2>/dev/null | wc -l)
[ "$leftover" -eq 0 ] || { echo "rendezvous files left behind:"; ls -la "$dir/lavaflow"; exit 1; }
echo "README channel example: 100 messages delivered, nothing left behind"
