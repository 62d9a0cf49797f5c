#!/usr/bin/env bash
# What CI leaves out to stay short, for a nightly job (or before trusting a change to what these
# cover): the build over Debian's torch by pip's route (a whole -O0 build of the project), the
# files labelled `nightly` (under torch 1.x: tests/CMakeLists.txt), and the stress repeats of the
# tests that hunt rare events (DETAUDIT_NIGHTLY=1 raises their counts; each file's docstring
# names what it repeats). Needs what tests/run_all.sh built.
#   tests/nightly.sh [ctest -R regex]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
[ -d "$root/build" ] || { echo "nightly: no ./build: run tests/run_all.sh first" >&2; exit 2; }
export DETAUDIT_NIGHTLY=1
# The rare-event repeats: deterministic DDP pairs that must all be identical, and the like.
export DETAUDIT_DDP_PAIRS=${DETAUDIT_DDP_PAIRS:-20}
export DETAUDIT_ABORT_RACE_RUNS=${DETAUDIT_ABORT_RACE_RUNS:-3}
export DETAUDIT_GLOO_TEARDOWN_RUNS=${DETAUDIT_GLOO_TEARDOWN_RUNS:-3}
cd "$root/build"
ctest --output-on-failure -j "$(nproc)" --timeout 3600 -R "${1:-e2e\.}"
