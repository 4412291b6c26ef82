#!/usr/bin/env bash
# The documented install command puts a working package where the interpreter looks: installed
# under a scratch DESTDIR, imported from there (and not from the build tree), then removed.
#   install.sh BUILD_DIR PYTHON SITE_DIR
set -euo pipefail
build=$1 python=$2 site=$3
dest=$(mktemp -d /tmp/lavaflow-py-install-XXXXXX)
trap 'rm -rf "$dest"' EXIT
DESTDIR=$dest cmake --install "$build" --component python > /dev/null
PYTHONPATH=$dest$site "$python" -c "
import lavaflow, os, sys
assert lavaflow.__file__.startswith('$dest'), lavaflow.__file__
assert os.path.exists(os.path.join(os.path.dirname(lavaflow.__file__), '_lavaflow.pyi'))
print('installed', lavaflow.__version__, 'at', os.path.dirname(lavaflow.__file__))
"
