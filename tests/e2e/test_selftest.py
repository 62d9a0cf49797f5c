"""`run --selftest` and `run --validate` on the programs users run (issue 83).

The self-test plants one change in each of forward, backward and optimizer, each in an extra run
of its own, and the diff must name the op at its step: on a plain loop (in full and under the
sentinel), a C++ libtorch program, two DDP ranks, torch.compile, Hugging Face's Trainer and
Lightning. A program built to hide a write (a custom op writing its parameter through data_ptr,
its schema declaring nothing) must have its blind spot named: found late, at the next step's
reader. `--validate` passes a deterministic program and fails (exit 6) one whose race fires only
without recording.

    cd build && ctest -R e2e.*test_selftest --output-on-failure
"""
import json
import os
import unittest

from detaudit_testlib import (HAS_COMPILE, PYTHON, TORCH_VERSION, build_binary, example,
                              export_records, in_parallel, make_temp_dir, program, python_answer,
                              read_json, record_pair, remove_dir)

HAS_TRAINER = python_answer(
    "import importlib.util as u;print(all(u.find_spec(m) for m in ('transformers', 'accelerate')))"
) == "True\n"
HAS_LIGHTNING = python_answer(
    "import importlib.util as u;print(bool(u.find_spec('lightning')))") == "True\n"
TORCH_2 = not TORCH_VERSION.startswith("1.")
PHASES = ["forward", "backward", "optimizer"]


class SelfTestOnPrograms(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = make_temp_dir()
        sgd = [PYTHON, example("train_sgd.py")]
        jobs = {"loop": (["--selftest"], sgd),
                "sentinel": (["--selftest", "--sentinel"], sgd),
                "cpp": (["--selftest"], [build_binary("train_cnn"), "--steps", "3"]),
                "hidden_write": (["--selftest"], [PYTHON, program("hidden_write.py")])}
        if TORCH_2:  # the other shapes once, under pip's torch
            jobs["ddp"] = (["--selftest"], [PYTHON, program("ddp_train.py"), "--launch", "env",
                                            "--steps", "3"])
            jobs["validate"] = (["--validate"], sgd)
            jobs["validate_race"] = (["--validate"], [PYTHON, program("race_unrecorded.py")])
        if HAS_COMPILE:
            jobs["compiled"] = (["--selftest"], [PYTHON, program("compiled_model.py"),
                                                 "--steps", "3"])
        if HAS_TRAINER:
            jobs["trainer"] = (["--selftest"], [PYTHON, program("hf_trainer.py"), "--steps", "3",
                                                "--race-from", "99"])
        if HAS_LIGHTNING:
            jobs["lightning"] = (["--selftest"], [PYTHON, program("lightning_resume.py"), "--out",
                                                  os.path.join(cls.tmp, "lightning-checkpoint")])
        names = list(jobs)
        cls.results = dict(zip(names, in_parallel(
            [lambda n=n: record_pair(os.path.join(cls.tmp, n), jobs[n][1], flags=jobs[n][0])
             for n in names])))

    @classmethod
    def tearDownClass(cls):
        remove_dir(cls.tmp)

    def result(self, name):
        if name not in self.results:
            self.skipTest(f"{name}: not in this torch's matrix")
        return self.results[name]

    def assert_found_at_their_ops(self, name):
        proc, report = self.result(name)
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        # The user's own runs carry no plant: they stay identical.
        self.assertEqual(report["verdict"], "identical", report["first_divergence"])
        selftest = report["selftest"]
        self.assertTrue(selftest["passed"], selftest)
        # One plant a phase, and no "silent" one: no op here returns nothing yet reads values.
        self.assertEqual([p["kind"] for p in selftest["plants"]], PHASES, selftest)
        for plant in selftest["plants"]:
            self.assertEqual(plant["outcome"], "found", plant)
            # Where the diff first saw it is the plant's own op at its step.
            self.assertIn(f"step {plant['step']} ", plant["seen_at"])
            self.assertTrue(plant["seen_at"].endswith(f"{plant['op']} (op #{plant['index']})"),
                            plant)
            self.assertNotEqual(plant["before"], plant["after"])
            planted = read_json(os.path.join(os.path.dirname(plant["run"]), "plant.json"))
            self.assertEqual((planted["status"], planted["op"], planted["step"]),
                             ("planted", plant["op"], plant["step"]))
            self.assertEqual(os.path.basename(os.path.dirname(plant["run"])),
                             f"selftest-{plant['kind']}")
        self.assertEqual(read_json(os.path.join(self.tmp, name, "selftest.json")), selftest)
        return selftest

    def test_a_plain_loop(self):
        self.assert_found_at_their_ops("loop")

    def test_under_the_sentinel_its_step_state_and_loss(self):
        selftest = self.assert_found_at_their_ops("sentinel")
        ops = [p["op"] for p in selftest["plants"]]
        # A lean step records its loss and its state: the backward's plant is a gradient the
        # step read, the optimizer's what it left.
        self.assertEqual(ops[1:], ["Optimizer.step#SGD.step"] * 2, selftest)

    def test_a_cpp_libtorch_program(self):
        self.assert_found_at_their_ops("cpp")

    def test_two_ddp_ranks(self):
        self.assert_found_at_their_ops("ddp")

    def test_torch_compile(self):
        self.assert_found_at_their_ops("compiled")

    def test_hugging_face_trainer(self):
        self.assert_found_at_their_ops("trainer")

    def test_lightning(self):
        self.assert_found_at_their_ops("lightning")

    def test_a_write_through_data_ptr_is_named_a_blind_spot(self):
        proc, report = self.result("hidden_write")
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        plants = {p["kind"]: p for p in report["selftest"]["plants"]}
        self.assertEqual((plants["forward"]["outcome"], plants["backward"]["outcome"]),
                         ("found", "found"), plants)
        # The op returns nothing and declares no write: the "silent" plant finds its write.
        hidden = plants["silent"]
        self.assertEqual((hidden["outcome"], hidden["op"], hidden["phase"], hidden["declared"]),
                         ("late", "detaudit_hidden::sgd_update", "optimizer", False), hidden)
        # First seen where the next step's forward reads the parameter.
        self.assertIn(f"step {hidden['step'] + 1} forward", hidden["seen_at"])
        self.assertIn("found late, a blind spot", hidden["line"])
        self.assertIn("a write its schema does not declare", hidden["line"])
        self.assertIn("1 late (a blind spot, named)", report["selftest"]["outcome"])

    def test_validate_passes_a_deterministic_program(self):
        proc, report = self.result("validate")
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        v = report["validation"]
        self.assertEqual((v["compared"], v["identical"], v["failed"]), (True, True, False), v)
        self.assertGreater(v["tensors"], 0)
        # Nothing was recorded in its runs: no op of any step.
        for i in (0, 1):
            records = export_records(os.path.join(v["runs"], f"run-{i}"))
            self.assertEqual([r["name"] for r in records if "inputs" in r], [], v["runs"])

    def test_validate_fails_when_recording_hid_the_divergence(self):
        proc, report = self.result("validate_race")
        self.assertEqual(report["verdict"], "identical")  # the recorded runs agree
        self.assertEqual(proc.returncode, 6, proc.stderr[-3000:])
        v = report["validation"]
        self.assertEqual((v["hidden"], v["failed"]), (True, True), v)
        self.assertIn("RECORDING HID THE DIVERGENCE", v["outcome"])
        self.assertIn("SGD.param_groups[0].params[0]", v["difference"])
        self.assertIn("the sentinel", v["sentinel"])


if __name__ == "__main__":
    unittest.main()
