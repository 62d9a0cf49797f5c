"""Steps seen however the user steps, and no verdict on a comparison that saw too little.

- The step recall matrix (programs/stepping_matrix.py): one gradient element scaled by 1.001 at
  one iteration of each cell, in one run; full recording and --sentinel must each find every
  cell at its step and no step before it, and the unplanted pair is identical. Cells: an eager
  step; PyTorch's "compile the optimizer" recipe (a compiled `opt.step()`, whose profiler scope
  dynamo drops); a compiled training step (forward, backward and step in one function);
  `torch.compile(model)` with fused and with foreach AdamW; LBFGS's closure; two optimizers an
  iteration. torch 2.x compiles; 1.13 runs the eager cells.
- Fail closed: a loop that trains with no optimizer step seen, a sentinel that compares no step
  state, and a program that fails in both runs get no "identical".

    cd tests/e2e && ../../.venv/bin/python -m unittest -v test_stepping
"""
import json
import os
import re
import unittest

from detaudit_testlib import (HAS_COMPILE, PYTHON, audit, divergent_steps, in_parallel,
                              make_temp_dir, planted_audit, program, python_answer, remove_dir,
                              sleeping_waits, warm_compile_cache)

MATRIX = program("stepping_matrix.py")
LIBRARIES = {"accelerate": "accelerate", "lightning-manual": "lightning",
             "trainer-compiled": "transformers"}
COMPILED_CELLS = ("compiled-opt-step", "compiled-train-step", "compiled-model-fused",
                  "compiled-model-foreach", "trainer-compiled", "compiled-opt-step-fullgraph")
INSTALLED = python_answer("import importlib.util as u, json; print(json.dumps("
                          f"[m for m in {sorted(set(LIBRARIES.values()))!r} if u.find_spec(m)]))")
MODES = {"full": [], "sentinel": ["--sentinel"]}

MANUAL_LOOP = """
import sys, torch
torch.manual_seed(0)
w = torch.randn(100, requires_grad=True)
for step in range(3):
    (w * w).sum().backward()
    with torch.no_grad():
        w -= 0.1 * w.grad
        w.grad.zero_()
    if "--marked" in sys.argv:
        with torch.profiler.record_function("detaudit::step"):
            pass
print(w.sum().item())
"""


class SteppingMatrix(unittest.TestCase):
    """Each way of stepping, planted at one iteration: found at that step."""

    @classmethod
    @sleeping_waits()
    def setUpClass(cls):
        cls.tmp = make_temp_dir()
        compiled, _ = warm_compile_cache(cls.tmp, [PYTHON, MATRIX])
        results = in_parallel([lambda mode=mode, flags=flags: planted_audit(
            os.path.join(cls.tmp, mode), [PYTHON, MATRIX], flags, env=compiled)
            for mode, flags in MODES.items()])
        cls.audits = dict(zip(MODES, results))

    @classmethod
    def tearDownClass(cls):
        remove_dir(cls.tmp)

    def check_mode(self, mode):
        audit = self.audits[mode]
        r, report = audit["run"], audit["planted"]
        self.assertEqual(r.returncode, 1, r.stdout[-2000:] + r.stderr[-2000:])
        self.assertEqual(report["verdict"], "divergent")
        log = audit["log"]
        cells = [(m[0], int(m[1]), int(m[2]), int(m[3])) for m in
                 re.findall(r"^cell (\S+) steps (\d+)-(\d+) planted (\d+)$", log, re.M)]
        skipped = re.findall(r"^cell (\S+) skipped: (.*)$", log, re.M)
        # Each cell runs, unless this torch or this environment cannot run it: 1.13 has no
        # torch.compile; torch 2.x refuses `fullgraph=True` for torch.optim's step (it breaks
        # the graph in _use_grad); accelerate and Lightning run where they are installed.
        allowed = {"compiled-opt-step-fullgraph": "graph_break" if HAS_COMPILE else "torch.compile"}
        for name, library in LIBRARIES.items():
            if library not in json.loads(INSTALLED or "[]"):
                allowed[name] = "is not installed"
        if not HAS_COMPILE:
            allowed.update({name: "torch.compile" for name in COMPILED_CELLS})
        refused = [(name, why) for name, why in skipped
                   if name not in allowed or allowed[name] not in why]
        self.assertEqual(refused, [], "cells that should have run")
        self.assertGreaterEqual(len(cells), 3)  # eager, lbfgs and two-optimizers run everywhere
        steps = divergent_steps(report)
        missed = []
        for name, first, last, planted in cells:
            found = sorted(s for s in steps if first <= s <= last)
            if not found or found[0] != planted:
                missed.append(f"{name}: planted at step {planted}, differences at {found}")
        self.assertEqual(missed, [], f"{mode}: {len(missed)} of {len(cells)} cells")
        clean = audit["clean"]
        self.assertEqual((clean["verdict"], clean["exit_code"]), ("identical", 0),
                         f"{mode}, unplanted: {json.dumps(clean)[:3000]}")
        # What the identical rests on: every step, and the optimizer's work in it.
        # (A cell torch refused ran its forward and backward into one step more.)
        self.assertIn(clean["compared"]["steps"] - (cells[-1][2] + 1), (0, 1), clean["compared"])
        return clean

    def check_optimizer_named(self, mode):
        """The first divergence, the eager cell's step 2, names the program's first optimizer:
        Adam over the MLP's 4 tensors, among every optimizer that stepped (one a cell, two in
        two-optimizers)."""
        if not HAS_COMPILE:
            return  # torch 1.13 has no global step hooks: no label, nothing named
        audit = self.audits[mode]
        first = audit["planted"]["first_divergence"]
        optimizers = len(re.findall(r"^cell \S+ steps ", audit["log"], re.M)) + 1
        self.assertEqual(first["step"], 2, first)
        self.assertEqual(first["optimizer"]["text"],
                         f"the 1st of {optimizers} optimizers, Adam over 4 tensors", first)

    def test_full_recording_finds_every_cell_at_its_step(self):
        clean = self.check_mode("full")
        self.assertGreater(clean["compared"]["optimizer_ops"], 0)
        self.check_optimizer_named("full")

    def test_the_sentinel_finds_every_cell_at_its_step(self):
        clean = self.check_mode("sentinel")
        self.assertGreater(clean["compared"]["step_states"], 0)
        self.check_optimizer_named("sentinel")


class FailClosed(unittest.TestCase):
    """No verdict from a comparison that saw too little."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = make_temp_dir()
        cls.loop = os.path.join(cls.tmp, "manual_loop.py")
        with open(cls.loop, "w") as f:
            f.write(MANUAL_LOOP)
        failing = ["-c", "import torch; torch.ones(3).sum(); raise SystemExit(3)"]
        gan = [PYTHON, MATRIX, "--cells", "two-optimizers", "--steps", "5", "--plant-step", "4"]
        cases = {"unmarked": ([PYTHON, cls.loop], []),
                 "gan": (gan, []),
                 "marked": ([PYTHON, cls.loop, "--marked"], []),
                 "sentinel": ([PYTHON, cls.loop], ["--sentinel"]),
                 "failing": ([PYTHON, *failing], [])}
        results = in_parallel([lambda c=c, f=f, n=n: audit(os.path.join(cls.tmp, n), c, f)
                               for n, (c, f) in cases.items()])
        cls.results = dict(zip(cases, results))

    @classmethod
    def tearDownClass(cls):
        remove_dir(cls.tmp)

    def test_a_loop_that_trains_with_no_step_seen_gets_no_verdict(self):
        r, report = self.results["unmarked"]
        self.assertEqual(r.returncode, 8, r.stderr[-2000:])
        self.assertEqual(report["verdict"], "no-verdict")
        self.assertIn("3 backward passes", report["no_verdict"])
        self.assertIn("detaudit::step", report["no_verdict"])

    def test_the_same_loop_with_its_steps_marked_passes(self):
        r, report = self.results["marked"]
        self.assertEqual(r.returncode, 0, r.stderr[-2000:])
        self.assertEqual(report["verdict"], "identical")
        self.assertGreaterEqual(report["compared"]["steps"], 3)

    def test_a_sentinel_that_compared_no_step_state_gets_no_verdict(self):
        r, report = self.results["sentinel"]
        self.assertEqual(r.returncode, 8, r.stderr[-2000:])
        self.assertEqual(report["verdict"], "no-verdict")
        self.assertIn("no step state", report["no_verdict"])

    def test_a_gans_step_names_which_of_its_optimizers_stepped(self):
        """Iteration 4's first optimizer step is step 8: the 1st of 2 optimizers, Adam over the
        first layer's weight and bias."""
        r, report = self.results["gan"]
        self.assertEqual(r.returncode, 1, r.stderr[-2000:])
        first = report["first_divergence"]
        self.assertEqual(first["step"], 8, first)
        if HAS_COMPILE:  # torch 1.13 has no global step hooks to name it by
            self.assertEqual(first["optimizer"], {"class": "Adam", "index": 1, "of": 2,
                                                  "tensors": 2, "text": "the 1st of 2 "
                                                  "optimizers, Adam over 2 tensors"}, first)

    def test_a_program_that_failed_in_both_runs_reads_failed(self):
        r, report = self.results["failing"]
        self.assertEqual(r.returncode, 4, r.stderr[-2000:])
        self.assertEqual(report["verdict"], "failed", json.dumps(report)[:2000])


if __name__ == "__main__":
    unittest.main()
