#!/usr/bin/env bash
# Installs, builds and runs every test: core unit tests, then the end-to-end tests on real
# programs once per torch, pip's torch 2.13 and Debian's libtorch 1.13.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# chromium renders the HTML report for its test; python3-jsonschema checks the timeline's schema.
"$root/tests/build.sh" --debian-torch chromium python3-jsonschema
cd "$root/build"
ctest --output-on-failure -j "$(nproc)" --timeout 900
