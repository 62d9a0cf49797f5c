#!/usr/bin/env bash
# Installs what is missing and builds detaudit into ./build (Release, with the interposer) for the
# torch of <source>/.venv, and with --debian-torch for Debian's libtorch 1.13 too.
#   tests/build.sh [--debian-torch]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tests/install_deps.sh" "$@"
torches="$root/.venv/bin/python"
for a in "$@"; do [ "$a" = --debian-torch ] && torches="$torches;system"; done
cmake -S "$root" -B "$root/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      "-DDETAUDIT_TORCH=$torches" >/dev/null
cmake --build "$root/build" -j "$(nproc)"
