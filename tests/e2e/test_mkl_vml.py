"""oneMKL VML's first-call race (pytorch#188792) under the real interposer, on the real kernel:
programs/vml_first_call.py makes the process's first VML tanh on two intra-op threads at once.

- Without the warm-up (`--no-mkl-vml-warm-up`), the race fires in some recorded runs; a pair of a
  raced and a clean run is `nondeterministic-op` at aten::tanh_, with the catalog entry.
- With the warm-up (the default), no recorded run races, and the fingerprint says it was done.
- The single-run risk report lists the tanh_ under `mkl-vml-first-call` without the warm-up only.

The race depends on timing: recorded with xxh3 and no statistics, 1 to 4 runs in 24 raced here
without the warm-up, and none of 60 on 2026-11-28 (plain runs too): oneMKL's race is not one a
test can make fire. Runs without it are recorded one at a time until one raced and one did not,
at most MAX_COLD_RUNS. When none raced, CI checks the rest (the fingerprint, the warm runs, the
risk report) and skips the diff, saying how many runs it tried; the nightly run fails instead. It
runs alone (ctest RUN_SERIAL): with another test on the 2 cores, none of 48 runs raced. torch
builds without MKL (Debian's) skip.

Each run is a `detaudit run --runs 1` of its own, so its risk report comes with it: the risk
report test reads the first run with and without the warm-up, not two runs more.

CI records WARM_RUNS = 4 runs with the warm-up; the nightly run (tests/nightly.sh,
DETAUDIT_NIGHTLY=1) records 32, and allows 96 runs without it, to catch a warm-up that fails
rarely.

    cd build && ctest -R e2e.*test_mkl_vml --output-on-failure
"""
import json
import os
import re
import sys
import unittest

from detaudit_testlib import (PYTHON, make_tmpdir, output_log, program, python_answer, read_json,
                              record, remove_tmpdir, run_detaudit)

NIGHTLY = bool(os.environ.get("DETAUDIT_NIGHTLY"))
MAX_COLD_RUNS = 96 if NIGHTLY else 16
WARM_RUNS = 32 if NIGHTLY else 4
PROGRAM = [PYTHON, program("vml_first_call.py")]
RACE_HIT = ("mkl-vml-first-call", "aten::tanh_")


def has_mkl():
    return (python_answer("import torch;print(torch.backends.mkl.is_available())") or
            "").strip() == "True"


_tmp = {}


def tearDownModule():
    remove_tmpdir(_tmp.get("dir"))


class ProgramRuns:
    """Runs of PROGRAM with FLAGS, recorded one at a time when a test asks for more, and kept for
    the other test: [(run dir, "clean" or "raced", its risk report)]."""

    def __init__(self, name, *flags):
        self.name, self.flags, self.runs = name, flags, []

    def record_one(self, test):
        if "dir" not in _tmp:
            _tmp["dir"] = make_tmpdir()
        out = os.path.join(_tmp["dir"], f"{self.name}{len(self.runs)}")
        risk = os.path.join(out, "risk.json")
        proc, run = record(out, PROGRAM, ["--digest", "xxh3", "--no-stats", "--format", "json",
                                          "--output", risk, *self.flags])
        test.assertEqual(proc.returncode, 0, proc.stderr)
        m = re.search(r"first call (clean|raced)", output_log(run))
        test.assertIsNotNone(m, output_log(run))
        self.runs.append((run, m.group(1), risk))

    def at_least(self, count, test):
        while len(self.runs) < count:
            self.record_one(test)
        return self.runs

    def of(self, outcome):
        return [run for run, said, _ in self.runs if said == outcome]


COLD = ProgramRuns("cold", "--no-mkl-vml-warm-up")
WARM = ProgramRuns("warm")


@unittest.skipUnless(has_mkl(), "this torch is built without MKL: no VML")
class MklVmlFirstCall(unittest.TestCase):
    def fingerprint(self, run):
        streams = os.path.join(run, "streams")
        env = [f for f in os.listdir(streams) if f.endswith(".env.json")]
        self.assertEqual(len(env), 1, env)
        return read_json(os.path.join(streams, env[0]))

    def risk_entries(self, runs):
        _, _, report = runs.at_least(1, self)[0]
        return {(h["entry"], h["op"]) for h in read_json(report)["ops"]}

    def test_the_risk_report_lists_the_race_only_without_the_warm_up(self):
        self.assertIn(RACE_HIT, self.risk_entries(COLD))
        self.assertNotIn(RACE_HIT, self.risk_entries(WARM))

    def test_the_race_is_named_without_the_warm_up_and_gone_with_it(self):
        COLD.at_least(1, self)
        while not (COLD.of("raced") and COLD.of("clean")) and len(COLD.runs) < MAX_COLD_RUNS:
            COLD.record_one(self)
        raced, clean = COLD.of("raced"), COLD.of("clean")
        self.assertFalse(self.fingerprint(COLD.runs[0][0])["determinism"]["mkl_vml_warm_up"])
        WARM.at_least(WARM_RUNS, self)
        self.assertEqual(WARM.of("raced"), [],
                         f"with the warm-up, {len(WARM.of('raced'))} of {len(WARM.runs)} runs "
                         f"raced (without it, {len(raced)} of {len(COLD.runs)})")
        self.assertTrue(self.fingerprint(WARM.runs[0][0])["determinism"]["mkl_vml_warm_up"])
        if not (raced and clean):
            said = (f"without the warm-up, {len(raced)} of {len(COLD.runs)} runs raced: no pair "
                    "of a raced and a clean run to diff (is anything else busy on the cores? the "
                    "race needs two threads entering together)")
            if NIGHTLY:
                self.fail(said)
            self.skipTest(said)
        r = run_detaudit(["diff", clean[0], raced[0], "--format", "json"])
        self.assertEqual(r.returncode, 1, r.stderr)
        f = json.loads(r.stdout)["first_divergence"]
        self.assertEqual(f["op"], "aten::tanh_", f)
        self.assertEqual(f["class"], "nondeterministic-op", f)
        self.assertEqual(f["catalog"]["id"], "mkl-vml-first-call", f)
        self.assertIn("mkl_vml_warm_up", f["remedy"])

        print(f"\nwithout the warm-up {len(raced)} of {len(COLD.runs)} runs raced; "
              f"with it, none of {len(WARM.runs)}", file=sys.stderr)


if __name__ == "__main__":
    unittest.main()
