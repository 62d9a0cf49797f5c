"""A C++ libtorch program recorded under the real interposer: `train_cnn` marks its steps with
DETAUDIT_STEP() and its optimizer with DETAUDIT_OPTIMIZER(); with --no-marker it is a plain
libtorch loop, recorded as one step 0.

    cd tests/e2e && ../../.venv/bin/python -m unittest -v test_record_cpp
"""
import collections
import os
import unittest

from detaudit_testlib import (RecordedRuns, build_binary, export_records, in_parallel, make_temp_dir, ops,
                              record, remove_dir, steps, tensors)

STEPS = 3
PARAMS = 12  # conv1, bn1, conv2, bn2, fc1, fc2: weight and bias each
LR = 0.01


class RecordCpp(RecordedRuns):
    @classmethod
    def jobs_to_record(cls):
        train_cnn = build_binary("train_cnn")
        return {
            "marked": [train_cnn, "--steps", str(STEPS)],
            "unmarked": [train_cnn, "--steps", str(STEPS), "--no-marker"],
        }

    def parameter_updates(self, step_ops):
        # torch::optim::SGD with momentum: p.add_(buf, -lr) for each parameter.
        return [o for o in step_ops
                if o["name"] == "aten::add_" and len(o["inputs"]) == 3
                and o["inputs"][2] == -LR]

    def test_marked_steps(self):
        recs = self.records("marked")
        self.assertEqual([s["step"] for s in steps(recs)], list(range(STEPS)))
        main = ops(recs)
        self.assertEqual(sorted({o["step"] for o in main}), list(range(STEPS)))
        by_order = sorted(main, key=lambda o: o["order"])
        self.assertEqual([o["step"] for o in by_order], sorted(o["step"] for o in by_order))
        for s in steps(recs):
            self.assertIn(s["order"], {o["order"] for o in main if o["step"] == s["step"]})

    def test_step_order_is_that_of_the_steps_first_op(self):
        # trace/records.h: StepInfo.order is "program order of the first op of the step". Step
        # 1 starts with zero_grad's aten::detach_ (order N), but the STEP record carries N + 1,
        # the order of the `detach_` nested in it, which is written first.
        recs = self.records("marked")
        for s in steps(recs):
            self.assertEqual(s["order"], min(o["order"] for o in ops(recs)
                                             if o["step"] == s["step"]), s)

    def test_marked_phases_and_layers(self):
        recs = self.records("marked")
        for k in range(STEPS):
            step_ops = sorted((o for o in ops(recs) if o["step"] == k), key=lambda o: o["order"])
            count = collections.Counter((o["name"], o["phase"]) for o in step_ops)
            for name, n in (("aten::conv2d", 2), ("aten::batch_norm", 2),
                            ("aten::max_pool2d", 1), ("aten::avg_pool2d", 1),
                            ("aten::bernoulli_", 1), ("aten::log_softmax", 1)):
                self.assertEqual(count[(name, "forward")], n, (k, name))
            for name, n in (("ConvolutionBackward0", 2), ("NativeBatchNormBackward0", 2),
                            ("MaxPool2DWithIndicesBackward0", 1), ("AvgPool2DBackward0", 1),
                            ("AddmmBackward0", 2), ("NllLossBackward0", 1)):
                self.assertEqual(count[(name, "backward")], n, (k, name))
            updates = self.parameter_updates(step_ops)
            self.assertEqual(len(updates), PARAMS, k)
            for u in updates:
                self.assertEqual(u["phase"], "optimizer", u)
            # The optimizer block is the DETAUDIT_OPTIMIZER() scope: after every backward op and
            # before the loss is read.
            phases = [o["phase"] for o in step_ops]
            first_opt = phases.index("optimizer")
            last_opt = len(phases) - 1 - phases[::-1].index("optimizer")
            self.assertNotIn("backward", phases[first_opt:])
            self.assertEqual(set(phases[first_opt:last_opt + 1]), {"optimizer"}, k)
            self.assertIn("backward", phases[:first_opt])
            for o in step_ops:
                for t in tensors(o["inputs"]) + tensors(o["outputs"]):
                    if "dtype" in t:
                        self.assertRegex(t["digest"], r"^[0-9a-f]{32}$")
        bern = ops(recs, "aten::bernoulli_")
        self.assertEqual(len(bern), STEPS)
        self.assertTrue(all(o["random"] and o["rng"] for o in bern))
        self.assertEqual(len({o["rng"] for o in bern}), STEPS)

    def test_marker_scopes_are_not_ops(self):
        names = {o["name"] for o in ops(self.records("marked"))}
        self.assertNotIn("detaudit::step", names)
        self.assertNotIn("detaudit::optimizer", names)

    def test_unmarked_program_is_one_step_0(self):
        recs = self.records("unmarked")
        self.assertEqual([s["step"] for s in steps(recs)], [0])
        main = ops(recs)
        self.assertEqual({o["step"] for o in main}, {0})
        # The same ops as the marked program, in the same order, and the no-grad work after a
        # backward still counts as the optimizer's.
        marked = self.records("marked")
        self.assertEqual([o["name"] for o in main], [o["name"] for o in ops(marked)])
        self.assertEqual(len(self.parameter_updates(main)), STEPS * PARAMS)
        for u in self.parameter_updates(main):
            self.assertEqual(u["phase"], "optimizer")
        self.assertEqual({o["phase"] for o in ops(recs, "ConvolutionBackward0")}, {"backward"})
        self.assertEqual({o["phase"] for o in ops(recs, "aten::conv2d")}, {"forward"})


if __name__ == "__main__":
    unittest.main()
