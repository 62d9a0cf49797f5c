"""oneMKL VML's first-call race (pytorch#188792) under the real interposer, on the real kernel:
programs/vml_first_call.py makes the process's first VML tanh on two intra-op threads at once.

- Without the warm-up (`--no-mkl-vml-warm-up`), the race fires in some recorded runs; a pair of a
  raced and a clean run is `nondeterministic-op` at aten::tanh_, with the catalog entry.
- With the warm-up (the default), no recorded run races, and the fingerprint says it was done.
- The single-run risk report lists the tanh_ under `mkl-vml-first-call` without the warm-up only.

The race depends on timing: recorded with xxh3 and no statistics, 1 to 4 runs in 24 raced here
without the warm-up. Runs without it are recorded in batches until one raced and one did not, at
most MAX_BATCHES; when that never happens, the test skips and says so. It runs alone (ctest
RUN_SERIAL): with another test on the 2 cores, none of 48 runs raced. torch builds without MKL
(Debian's) skip too.

    cd build && ctest -R e2e.*test_mkl_vml --output-on-failure
"""
import json
import os
import re
import sys
import unittest

from detaudit_testlib import (PYTHON, TmpDirCase, output_log, program, read_json, record,
                              run_detaudit, run_program)

BATCH = 8
MAX_BATCHES = 6
WARM_RUNS = 16
PROGRAM = [PYTHON, program("vml_first_call.py")]


def has_mkl():
    r = run_program([PYTHON, "-c", "import torch;print(torch.backends.mkl.is_available())"])
    return r.stdout.strip() == "True"


@unittest.skipUnless(has_mkl(), "this torch is built without MKL: no VML")
class MklVmlFirstCall(TmpDirCase):
    def record_runs(self, name, count, *flags):
        """COUNT recorded runs; returns {"clean": [run dirs], "raced": [run dirs]}."""
        out = os.path.join(self.tmp, name)
        proc, _ = record(out, PROGRAM, ["--runs", str(count), "--digest", "xxh3", "--no-stats",
                                        "--format", "json", *flags], timeout=600)
        self.assertIn(proc.returncode, (0, 1), proc.stderr)
        runs = {"clean": [], "raced": []}
        for i in range(count):
            run = os.path.join(out, f"run-{i}")
            m = re.search(r"first call (clean|raced)", output_log(run))
            self.assertIsNotNone(m, output_log(run))
            runs[m.group(1)].append(run)
        return runs

    def fingerprint(self, run):
        streams = os.path.join(run, "streams")
        env = [f for f in os.listdir(streams) if f.endswith(".env.json")]
        self.assertEqual(len(env), 1, env)
        return read_json(os.path.join(streams, env[0]))

    def risk_entries(self, name, *flags):
        out = os.path.join(self.tmp, name)
        report = os.path.join(out, "risk.json")
        proc, _ = record(out, PROGRAM, ["--format", "json", "--output", report, *flags])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return {(h["entry"], h["op"]) for h in read_json(report)["ops"]}

    def test_the_risk_report_lists_the_race_only_without_the_warm_up(self):
        hit = ("mkl-vml-first-call", "aten::tanh_")
        self.assertIn(hit, self.risk_entries("risk-cold", "--no-mkl-vml-warm-up"))
        self.assertNotIn(hit, self.risk_entries("risk-warm"))

    def test_the_race_is_named_without_the_warm_up_and_gone_with_it(self):
        cold = {"clean": [], "raced": []}
        for batch in range(MAX_BATCHES):
            runs = self.record_runs(f"cold{batch}", BATCH, "--no-mkl-vml-warm-up")
            for k in cold:
                cold[k] += runs[k]
            if cold["raced"] and cold["clean"]:
                break
        cold_runs = len(cold["clean"]) + len(cold["raced"])
        self.assertFalse(self.fingerprint((cold["clean"] + cold["raced"])[0])
                         ["determinism"]["mkl_vml_warm_up"])
        if not cold["raced"] or not cold["clean"]:
            self.skipTest(f"without the warm-up, {len(cold['raced'])} of {cold_runs} runs raced: "
                          "no pair of a raced and a clean run to diff")
        r = run_detaudit(["diff", cold["clean"][0], cold["raced"][0], "--format", "json"])
        self.assertEqual(r.returncode, 1, r.stderr)
        f = json.loads(r.stdout)["first_divergence"]
        self.assertEqual(f["op"], "aten::tanh_", f)
        self.assertEqual(f["class"], "nondeterministic-op", f)
        self.assertEqual(f["catalog"]["id"], "mkl-vml-first-call", f)
        self.assertIn("mkl_vml_warm_up", f["remedy"])

        warm = self.record_runs("warm", WARM_RUNS)
        self.assertEqual(len(warm["raced"]), 0,
                         f"with the warm-up, {len(warm['raced'])} of {WARM_RUNS} runs raced "
                         f"(without it, {len(cold['raced'])} of {cold_runs})")
        self.assertTrue(self.fingerprint(warm["clean"][0])["determinism"]["mkl_vml_warm_up"])
        print(f"\nwithout the warm-up {len(cold['raced'])} of {cold_runs} runs raced; "
              f"with it, none of {WARM_RUNS}", file=sys.stderr)


if __name__ == "__main__":
    unittest.main()
