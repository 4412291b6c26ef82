#!/usr/bin/env bash
# Every C/C++/CUDA source of the repository follows .clang-format (clang-format 14, Debian 12's).
#   check_format.sh SOURCE_DIR
set -euo pipefail
cd "$1"
mapfile -t files < <(git ls-files '*.cpp' '*.hpp' '*.h' '*.cu')
if ! clang-format --dry-run --Werror "${files[@]}" 2>"${TMPDIR:-/tmp}/lavaflow-format.$$"; then
  grep "warning:\|error:" "${TMPDIR:-/tmp}/lavaflow-format.$$" | sed 's/: warning: code should be clang-formatted.*//' | sort -u | head -40
  rm -f "${TMPDIR:-/tmp}/lavaflow-format.$$"
  echo "FAILED: the files above are not formatted: run clang-format -i on them"
  exit 1
fi
rm -f "${TMPDIR:-/tmp}/lavaflow-format.$$"
echo "all ${#files[@]} sources follow .clang-format"
