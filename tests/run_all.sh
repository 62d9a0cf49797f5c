#!/usr/bin/env bash
# Installs, builds and runs every test: core unit tests and end-to-end tests on real programs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/tests/build.sh"
cd "$root/build"
ctest --output-on-failure -j "$(nproc)" --timeout 900
