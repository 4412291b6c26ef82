#!/usr/bin/env bash
# Installs the Debian 12 packages lava-flow builds and tests with, when they are missing.
# Run as root (or with sudo available). Installs nothing when everything is present.
set -euo pipefail
pkgs=(
  cmake g++ ninja-build pkg-config git clang-format
  libvulkan-dev mesa-vulkan-drivers vulkan-tools glslc
  libglew-dev libglfw3-dev libegl-dev libgl-dev
  mpich libmpich-dev libgloo-dev
  opencl-headers ocl-icd-opencl-dev pocl-opencl-icd clinfo
  catch2 libcli11-dev nlohmann-json3-dev libnuma-dev xvfb libclang-rt-14-dev zlib1g-dev gnuplot-nox iproute2
  python3-dev pybind11-dev python3-numpy python3-torch python3-pytest
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "lava-flow: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
