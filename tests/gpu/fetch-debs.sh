#!/usr/bin/env bash
# Once per checkout, before the GPU tier: the shared recipe's packages (../shared/gpu/fetch-debs.sh)
# plus the header-only libraries the apps build with (CLI11, nlohmann-json), which the GPU
# machine lacks too. All land in ./.gpu-debs; `. .gpu-debs/unpack.sh` there unpacks every one.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
bash "$root/../shared/gpu/fetch-debs.sh"
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/gpu-debs-lists'
(cd .gpu-debs && apt-get $o download libcli11-dev nlohmann-json3-dev 2>&1 | grep -v '^Get:\|unsandboxed' || true)
ls .gpu-debs/libcli11-dev_*.deb .gpu-debs/nlohmann-json3-dev_*.deb
