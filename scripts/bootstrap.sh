#!/usr/bin/env bash
# Installs what is missing (Debian 12, as root), then configures and builds wrapcert.
# Used by scripts/main.sh, scripts/test.sh and scripts/bench.sh; safe to run again.
#   scripts/bootstrap.sh [TARGET...]   build only these targets (default: everything)
#   scripts/bootstrap.sh --packages    install what is missing, and nothing else
#   BUILD_DIR  build folder (default: build)
#   WRAPCERT_CMAKE_ARGS  extra arguments for the configure step
#   WRAPCERT_NO_APT=1    install nothing (e.g. with your own LibTorch via CMAKE_PREFIX_PATH)
set -euo pipefail

cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}

packages=(
  g++ cmake ninja-build ccache python3 python3-torch python3-matplotlib python3-scipy
  libtorch-dev libgloo-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev librapidcheck-dev
  nlohmann-json3-dev libcli11-dev libpugixml-dev
  libzip-dev zipcmp zipmerge ziptool  # libzip's CMake package names its three tools
  libarchive-dev  # NeMo's .nemo archives (tar, tar.gz)
  clang libclang-rt-14-dev clang-tidy
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ] && [ "${WRAPCERT_NO_APT:-0}" != 1 ]; then
  echo "wrapcert: installing ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "wrapcert: missing packages need root (run as root, or: sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

[ "${1:-}" = --packages ] && exit 0

# ccache hits across clones: paths under the checkout are hashed relative to it.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$(pwd)}"
# shellcheck disable=SC2086  # WRAPCERT_CMAKE_ARGS is a list of arguments
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${WRAPCERT_CMAKE_ARGS:-} >/dev/null
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build "$BUILD_DIR" -j "$(nproc)" "${targets[@]}"
