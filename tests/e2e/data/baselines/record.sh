#!/usr/bin/env bash
# Records the stored baselines that test_numerics checks later CI runs against (docs/report.md,
# "A stored baseline"): sentinel runs of numerics_mlp.py under pip's torch (.venv). Run it again
# when the trace format changes; the test then says so.
#   tests/e2e/data/baselines/record.sh
set -euo pipefail
root=$(cd "$(dirname "$0")/../../../.." && pwd)
cd "$root"
rm -rf tests/e2e/data/baselines/numerics_mlp
"$root/build/bin/detaudit" record --sentinel --node baseline -q \
  --out tests/e2e/data/baselines/numerics_mlp -- .venv/bin/python tests/e2e/programs/numerics_mlp.py
rm -rf tests/e2e/data/baselines/numerics_mlp/compile-cache
