#!/usr/bin/env bash
# The README's first command: install what is missing, build, run lavaflow-demo (on lavapipe when
# there is no GPU). Extra arguments go to lavaflow-demo.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/cmake/install-deps.sh"
build="$root/build/release"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DLAVAFLOW_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" --target lavaflow-demo lavaflow-info
"$build/apps/demo/lavaflow-demo" "$@"
