#!/usr/bin/env bash
# The install tree holds the public headers of exactly the built components, and no installed
# program carries a path of the build tree.
#   check_install.sh PREFIX BUILD_DIR COMPONENT...
set -euo pipefail
shopt -s nullglob
prefix=$1 build=$2
shift 2
all="$*"
all=${all//;/ }
built=" $all "
inc=$prefix/include/lavaflow
for c in core transports mesh mesh_mpi mesh_cuda mesh_nccl cuda opencl opengl mpi c; do
  case $c in
    core) dir=$inc/core ;;
    transports) dir=$inc/transports ;;
    c) dir=$inc/lavaflow.h ;;
    *) dir=$inc/$c ;;
  esac
  # Headers count, not directories: a copy of the tree may carry an empty folder.
  headers=$( (find "$dir" -type f 2>/dev/null || true) | wc -l)
  if [[ $built == *" $c "* ]]; then
    [ "$headers" -gt 0 ] || { echo "FAILED: component $c was built but $dir has no header"; exit 1; }
  elif [ "$headers" -gt 0 ]; then
    echo "FAILED: component $c was not built but $dir holds $headers installed header(s)"; exit 1
  fi
done
for exe in "$prefix"/bin/*; do
  if readelf -d "$exe" | grep -E "R(UN)?PATH" | grep -q "$build"; then echo "FAILED: $exe has an RPATH into the build tree"; exit 1; fi
  if grep -q -a -F "$build" "$exe"; then echo "FAILED: $exe contains the build-tree path $build"; exit 1; fi
done
echo "installed: headers of exactly [$all]; no build-tree path in $(ls "$prefix"/bin | wc -l) programs"
