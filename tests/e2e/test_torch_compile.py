"""torch.compile (inductor on the CPU) under the recorder, on torch 2.x: a compiled program is
recorded truthfully (its regions marked, their kernels named opaque in the report), gives the same
verdict whether or not inductor's cache was warm (the seeded pair compiles from a cache per run,
the unseeded one loads what a plain run compiled), computes the same bits as without detaudit, and
an unseeded generator is still rng-state. Skipped where torch has no torch.compile (1.13).

    cd tests/e2e && ../../.venv/bin/python -m unittest -v test_torch_compile
"""
import json
import os
import unittest

from detaudit_testlib import (HAS_COMPILE, PYTHON, TORCH_VERSION, export_records, in_parallel,
                              load_report, make_temp_dir, ops, params_sha, program, remove_dir,
                              run_detaudit, run_program, warm_compile_cache)

SCRIPT = program("compiled_model.py")


@unittest.skipUnless(HAS_COMPILE, f"torch {TORCH_VERSION} has no torch.compile")
class TorchCompile(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = make_temp_dir()
        out = os.path.join(cls.tmp, "seeded")
        dropout = os.path.join(cls.tmp, "dropout")
        unseeded = [PYTHON, SCRIPT, "--steps", "2", "--unseeded-dropout"]

        def warm_dropout():
            # Recorded from a cache a plain run filled: the verdict must not depend on it.
            env, _ = warm_compile_cache(os.path.join(cls.tmp, "dropout-cache"), unseeded)
            return run_detaudit(["run", "--runs", "2", "--out", dropout, "-q", "--format",
                                 "json", "--output", os.path.join(cls.tmp, "dropout.json"),
                                 "--", *unseeded], timeout=600, env=env)

        cls.seeded, cls.dropout, cls.plain = in_parallel([
            lambda: run_detaudit(["run", "--runs", "2", "--out", out, "-q", "--format", "json",
                                  "--output", os.path.join(cls.tmp, "seeded.json"), "--",
                                  PYTHON, SCRIPT, "--steps", "2"], timeout=600),
            warm_dropout,
            lambda: run_program([PYTHON, SCRIPT, "--steps", "2"],
                                env={"TORCHINDUCTOR_CACHE_DIR": os.path.join(cls.tmp, "cache")},
                                timeout=600),
        ])
        cls.seeded_dir = out

    @classmethod
    def tearDownClass(cls):
        remove_dir(cls.tmp)

    def test_seeded_compiled_training_is_identical_with_regions_named(self):
        self.assertEqual(self.seeded.returncode, 0, self.seeded.stdout + self.seeded.stderr)
        report = load_report(os.path.join(self.tmp, "seeded.json"))
        self.assertEqual(report["verdict"], "identical")
        regions = {r for s in report["streams"] for r in s["compiled_regions"]}
        self.assertIn("CompiledFunction", regions)
        self.assertIn("CompiledFunctionBackward", regions)
        # The region records are in the trace, marked, with their inputs.
        recs = export_records(os.path.join(self.seeded_dir, "run-0"))
        marked = [o for o in ops(recs) if o["compiled_region"]]
        self.assertEqual({o["name"] for o in marked} & regions, regions)
        forward = [o for o in marked if o["name"] == "CompiledFunction"]
        self.assertEqual(len(forward), 2)  # one call a step
        self.assertTrue(all(o["inputs"] for o in forward))
        # No op ran on torch.compile's FakeTensors made it into the trace.
        for o in ops(recs):
            self.assertNotIn("fake tensor", json.dumps([o["inputs"], o["outputs"]]), o["name"])

    def test_each_run_compiles_from_its_own_cache(self):
        for run in ("run-0", "run-1"):
            cache = os.path.join(self.seeded_dir, run, "compile-cache", "torchinductor")
            self.assertTrue(os.path.isdir(cache) and os.listdir(cache), cache)

    def test_recording_does_not_change_the_compiled_result(self):
        self.assertEqual(self.plain.returncode, 0, self.plain.stderr)
        plain = params_sha(self.plain.stdout)
        self.assertIsNotNone(plain)
        for run in ("run-0", "run-1"):
            with open(os.path.join(self.seeded_dir, run, "output.log")) as f:
                self.assertEqual(params_sha(f.read()), plain, run)

    def test_dynamic_shapes_trace_without_errors_swallowed(self):
        """dynamic=True traces with symbolic sizes, whose numel() throws: the recorder tells such
        tensors apart before asking (a c10::Error's message symbolizes a backtrace; a recorded
        compile took 2.3x its plain time). DETAUDIT_DEBUG says every swallowed error."""
        out = os.path.join(self.tmp, "dynamic")
        r = run_detaudit(["run", "--runs", "2", "--out", out, "-q", "--",
                          PYTHON, program("compiled_dynamic.py")],
                         env={"DETAUDIT_DEBUG": "1"}, timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("IDENTICAL", r.stdout)
        for i in (0, 1):
            with open(os.path.join(out, f"run-{i}", "output.log")) as f:
                log = f.read()
            self.assertNotIn("symbolic sizes", log)
            self.assertIn("final loss", log)

    def test_unseeded_dropout_in_a_compiled_program_is_rng_state(self):
        self.assertEqual(self.dropout.returncode, 1, self.dropout.stdout + self.dropout.stderr)
        report = load_report(os.path.join(self.tmp, "dropout.json"))
        self.assertEqual(report["first_divergence"]["class"], "rng-state",
                         json.dumps(report["first_divergence"], indent=1)[:2000])


if __name__ == "__main__":
    unittest.main()
