#!/usr/bin/env bash
# Installs what is missing and builds detaudit into ./build for the torch of <source>/.venv (and
# with --debian-torch for Debian's libtorch 1.13 too), by the route users take: `pip install
# --no-build-isolation .` into that environment (pyproject.toml), keeping CMake's build tree in
# ./build, with the tests, for ctest. .venv/bin/detaudit is then the installed CLI.
# --no-tests (quickstart.sh) leaves out the tests and the C++ examples: what a user needs only.
# With the tests, the code's contracts are checked (DETAUDIT_CHECKS, src/util/check.h).
# --no-bench (run_all.sh) leaves out the benchmark's programs, which no test runs.
#   tests/build.sh [--debian-torch] [--training-loops] [--no-tests] [--no-bench]
#                  [extra-debian-package...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
torches="$root/.venv/bin/python"
tests=ON
bench=ON
deps=()
for a in "$@"; do
  case $a in
    --debian-torch) torches="$torches;system"; deps+=("$a");;
    --no-tests) tests=OFF; bench=OFF;;
    --no-bench) bench=OFF;;
    *) deps+=("$a");;
  esac
done
"$root/tests/install_deps.sh" "${deps[@]}"
"$root/.venv/bin/pip" install --no-build-isolation --disable-pip-version-check -v "$root" \
  -C build-dir="$root/build" -C cmake.build-type=RelWithDebInfo \
  -C "cmake.define.DETAUDIT_TORCH=$torches" -C "cmake.define.DETAUDIT_BUILD_TESTS=$tests" \
  -C "cmake.define.DETAUDIT_BUILD_EXAMPLES=$tests" -C "cmake.define.DETAUDIT_BUILD_BENCH=$bench" \
  -C "cmake.define.DETAUDIT_CHECKS=$tests"
