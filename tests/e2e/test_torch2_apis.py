"""torch 2.x APIs recorded with the right phases and steps: torch.accelerator, torch.func
(per-sample gradients with vmap and grad) and Adam's foreach and fused implementations. Skipped
on torch 1.13, which has none of them.

    cd tests/e2e && ../../.venv/bin/python -m unittest -v test_torch2_apis
"""
import os
import unittest

from detaudit_testlib import (PYTHON, TORCH_VERSION, export_records, in_parallel, make_temp_dir,
                              ops, program, remove_dir, run_detaudit)

SCRIPT = program("torch2_features.py")
STEPS = 3
IS_2X = int(TORCH_VERSION.split(".")[0]) >= 2


@unittest.skipUnless(IS_2X, f"torch {TORCH_VERSION} has no torch.func/torch.accelerator")
class Torch2Apis(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = make_temp_dir()
        cls.results = dict(zip(("foreach", "fused"), in_parallel([
            lambda impl=impl: run_detaudit(
                ["run", "--runs", "2", "--out", os.path.join(cls.tmp, impl), "-q", "--",
                 PYTHON, SCRIPT, "--steps", str(STEPS), "--impl", impl])
            for impl in ("foreach", "fused")])))

    @classmethod
    def tearDownClass(cls):
        remove_dir(cls.tmp)

    def check(self, impl, optimizer_op):
        r = self.results[impl]
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("IDENTICAL", r.stdout)
        recs = export_records(os.path.join(self.tmp, impl, "run-0"))
        for step in range(STEPS):
            phases = {o["phase"] for o in ops(recs) if o["step"] == step}
            self.assertEqual(phases, {"forward", "backward", "optimizer"}, f"step {step}")
            update = [o for o in ops(recs, optimizer_op) if o["step"] == step]
            self.assertEqual(len(update), 1, f"one {optimizer_op} in step {step}")
        for o in ops(recs):
            if "_foreach_" in o["name"] or "_fused_" in o["name"]:
                self.assertEqual(o["phase"], "optimizer", o["name"])
        # torch.func's per-sample gradients run their own backward inside the forward pass.
        self.assertTrue(ops(recs, "*Backward*", phase="backward"))

    def test_foreach_adam(self):
        self.check("foreach", "aten::_foreach_addcdiv_")

    def test_fused_adam(self):
        self.check("fused", "aten::_fused_adam_")


if __name__ == "__main__":
    unittest.main()
