"""`detaudit resume` on the loops users run (issue 81): Hugging Face Trainer resumed from its own
checkpoint, Lightning with fit(ckpt_path=...) (automatic and by hand, with a ModelCheckpoint),
accelerate's save_state/load_state, a loop of one's own through --stop-args/--resume-args, and
all of them under --sentinel and --steps. test_resume.py holds the plain loop's matrix.

    cd build && ctest -R e2e.*test_resume_loops --output-on-failure
"""
import os
import unittest

from detaudit_testlib import PYTHON, TmpDirCase, in_parallel, load_report, program, run_detaudit
from test_resume import (LIGHTNING, LOOP, STEPS, STOP, TRAINER, _HAS_LIGHTNING, _HAS_TRANSFORMERS,
                         diff_report, record, record_stopped_and_resumed)


@unittest.skipUnless(_HAS_TRANSFORMERS, "transformers and accelerate are not installed")
class TrainerResume(TmpDirCase):
    """Hugging Face Trainer resumed from its own checkpoint (resume_from_checkpoint), 8 steps
    saved at 4, logging off: its parameters and optimizer state resume bit for bit, and the
    loss it sums for logging (tr_loss) starts again from 0."""

    def test_trainer_resumes_its_training_and_restarts_its_logged_loss(self):
        through = record(os.path.join(self.tmp, "through"),
                         TRAINER + ["--out", os.path.join(self.tmp, "out-through")])
        out = os.path.join(self.tmp, "out-resumed")
        resumed = record_stopped_and_resumed(os.path.join(self.tmp, "resumed"), TRAINER,
                                             ["--out", out, "--stop"], ["--out", out, "--resume"])
        report = diff_report(self, through, resumed, os.path.join(self.tmp, "trainer.json"), 1)
        resume = report["resumes"][0]
        self.assertEqual((resume["process"], resume["step"]), ("r0.main~1", 4), resume)
        self.assertIn("read at step 4 only", resume["found_by"])
        f = report["first_divergence"]
        self.assertEqual((f["stream"], f["step"], f["op"]), ("r0.main~1.t-main", 4, "aten::add_"),
                         f)
        self.assertTrue(resume["missing"].startswith("a running value"), resume)
        self.assertIn("Trainer's tr_loss", f["cause"])
        # What training computes agrees: every tensor the optimizer wrote. The logged sum is a
        # value outside training, by its data flow.
        spread = report["spread"]
        self.assertGreater(spread["parameters_tracked"], 0, spread)
        self.assertEqual(spread["parameters_diverged"], [], spread)
        self.assertIn("training is the same", f["cause"])
        self.assertEqual([p.get("tensor_role") for p in f["inputs"] if p["differs"]],
                         ["outside training"], f["inputs"])
        self.assertIs(f["reaches_training"], False, f)
        self.assertTrue(report["training"]["identical"], report["training"])
        self.assertTrue(resume["training_verified"], resume)
        self.assertFalse(resume["verified"], resume)


@unittest.skipUnless(_HAS_LIGHTNING, "lightning is not installed")
class LightningResume(TmpDirCase):
    """Lightning's Trainer stopped after its first epoch (4 steps) and resumed with
    fit(ckpt_path=...). Its checkpoint does not hold torch's generator, which the shuffling
    sampler draws from at the next epoch: named, with the hooks that save it; with them, the
    resume is bit for bit."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.through = record(os.path.join(cls.tmp, "through"),
                             LIGHTNING + ["--out", os.path.join(cls.tmp, "out-through")])

    def diff(self, flags, expect):
        name = "rng" if flags else "plain"
        out = os.path.join(self.tmp, f"out-{name}")
        resumed = record_stopped_and_resumed(os.path.join(self.tmp, f"resumed-{name}"), LIGHTNING,
                                             ["--out", out, "--stop", *flags],
                                             ["--out", out, "--resume", *flags])
        report = diff_report(self, self.through, resumed,
                             os.path.join(self.tmp, f"lightning-{name}.json"), expect)
        self.assertEqual([(x["process"], x["step"]) for x in report["resumes"]],
                         [("r0.main~1", 4)], (report["resumes"], report["notes"]))
        return report, report["resumes"][0]

    def test_its_checkpoint_misses_torchs_generator(self):
        report, resume = self.diff([], 1)
        f = report["first_divergence"]
        self.assertEqual((f["class"], f["step"], f["stream"]), ("rng-state", 4, "r0.main~1.t-main"),
                         f)
        self.assertEqual(resume["missing"], "torch's CPU generator", resume)
        self.assertIn("a Lightning checkpoint does not", f["remedy"])
        self.assertIn("on_load_checkpoint", f["remedy"])

    def test_with_the_generator_saved_the_resume_is_bit_for_bit(self):
        report, resume = self.diff(["--save-rng"], 0)
        self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))
        self.assertTrue(resume["verified"], resume)


@unittest.skipUnless(_HAS_TRANSFORMERS, "transformers and accelerate are not installed")
class AccelerateResume(TmpDirCase):
    """A loop of one's own under accelerate, saved with `save_state` after step 5 (mid-epoch,
    a seedable sampler) and resumed with `load_state` and `skip_first_batches`, as its docs show.
    Complete, it is bit for bit. Each piece users leave out is named at its step: a scheduler
    not passed to prepare (its LR, a step after the resume), the batches not skipped, the epoch
    not told to the resumed loader (both the data order), and a loader without a generator of
    its own, whose new iterator draws from torch's generator after load_state restored it."""

    AT = 6
    OMIT = ["", "scheduler", "skip", "epoch", "generator"]

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        accelerate = [PYTHON, program("accelerate_resume.py")]

        def resumed(omit):
            state = os.path.join(cls.tmp, f"state-{omit or 'all'}")
            flags = ["--omit", omit]
            return lambda: record_stopped_and_resumed(
                os.path.join(cls.tmp, f"resumed-{omit or 'all'}"), accelerate,
                flags + ["--stop-at", str(cls.AT), "--save", state], flags + ["--resume", state])

        # A loader without a generator of its own draws from torch's in the run through too:
        # that cell has a run through of its own.
        runs = in_parallel(
            [lambda: record(os.path.join(cls.tmp, "through"), accelerate),
             lambda: record(os.path.join(cls.tmp, "through-generator"),
                            accelerate + ["--omit", "generator"])] +
            [resumed(omit) for omit in cls.OMIT])
        cls.through = {"": runs[0], "generator": runs[1]}
        cls.resumed = dict(zip(cls.OMIT, runs[2:]))

    def diff(self, omit, expect):
        through = self.through.get(omit, self.through[""])
        report = diff_report(self, through, self.resumed[omit],
                             self.resumed[omit] + ".json", expect)
        self.assertEqual([(x["process"], x["step"]) for x in report["resumes"]],
                         [("r0.main~1", self.AT)], (report["resumes"], report["notes"]))
        return report, report["resumes"][0], report["first_divergence"]

    def test_save_state_and_load_state_resume_bit_for_bit(self):
        report, resume, _ = self.diff("", 0)
        self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))
        self.assertTrue(resume["verified"], resume)

    def test_a_scheduler_not_prepared_is_named_by_its_lr_a_step_later(self):
        # The optimizer's state holds step 6's LR; the fresh scheduler sets step 7's.
        _, resume, f = self.diff("scheduler", 1)
        self.assertTrue(resume["missing"].startswith("a hyperparameter"), resume)
        self.assertEqual((f["phase"], f["step"]), ("optimizer", self.AT + 1), f)
        self.assertIn("state_dict()", f["remedy"])

    def test_batches_not_skipped_and_an_epoch_not_told_are_the_data_order(self):
        for omit in ("skip", "epoch"):
            _, resume, f = self.diff(omit, 1)
            self.assertEqual(resume["missing"], "the data order", (omit, resume))
            self.assertEqual(f["step"], self.AT, f)
            self.assertIn("its data loader started over", f["cause"])

    def test_a_loader_drawing_from_torchs_generator_after_load_state_is_named(self):
        _, resume, f = self.diff("generator", 1)
        self.assertTrue(resume["missing"].startswith("torch's CPU generator as it stood"), resume)
        self.assertEqual((f["class"], f["step"], f["op"]), ("rng-state", self.AT,
                                                            "aten::bernoulli_"), f)
        self.assertIn("torch's CPU generator was restored, then drawn before step 6: "
                      "aten::random_", f["cause"])
        self.assertIn("DataLoader(..., generator=", f["remedy"])


class OneCommand(TmpDirCase):
    """`detaudit resume --at K -- PROGRAM`: the program run through, then stopped at step K and
    resumed from its checkpoint, then the diff. A loop of one's own is stopped and resumed by the
    arguments its user names; Trainer and Lightning by the interposer's Python side."""

    def resume(self, name, flags, program, expect):
        out = os.path.join(self.tmp, name)
        report = os.path.join(self.tmp, f"{name}.json")
        r = run_detaudit(["resume", "--out", out, "-q", *flags, "--format", "json", "-o", report,
                          "--", *program])
        self.assertEqual(r.returncode, expect, r.stdout + r.stderr)
        report = load_report(report)
        self.assertEqual(len(report["resumes"]), 1, report["notes"])
        return report, report["resumes"][0]

    def test_a_loop_of_ones_own_by_the_arguments_named(self):
        # Split as the shell splits them: a quoted path keeps its space.
        ck = os.path.join(self.tmp, "my loop.pt")
        report, resume = self.resume(
            "loop", ["--at", str(STOP), "--stop-args", f"--stop-at {STOP} --save '{ck}'",
                     "--resume-args", f'--resume "{ck}"'], LOOP + ["--steps", str(STEPS)], 0)
        self.assertTrue(os.path.exists(ck), ck)
        self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))
        self.assertEqual((resume["step"], resume["verified"]), (STOP, True), resume)
        # Again into the same --out: refused before anything runs, unless --force.
        r = run_detaudit(["resume", "--out", os.path.join(self.tmp, "loop"), "--at", str(STOP),
                          "--", *LOOP])
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertIn("already holds a run: give another --out, or --force", r.stderr)

    def loop_flags(self, name, omit=""):
        ck = os.path.join(self.tmp, f"{name}.pt")
        return ["--at", str(STOP), "--stop-args", f"--omit '{omit}' --stop-at {STOP} --save {ck}",
                "--resume-args", f"--omit '{omit}' --resume {ck}"]

    def test_under_the_sentinel_a_complete_checkpoint_is_verified_step_by_step(self):
        report, resume = self.resume("sentinel-all", ["--sentinel", *self.loop_flags("s-all")],
                                     LOOP + ["--steps", str(STEPS)], 0)
        self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))
        self.assertEqual((resume["step"], resume["verified"]), (STOP, True), resume)
        self.assertFalse(report["sentinel"]["divergent"], report["sentinel"])
        self.assertGreater(report["compared"]["ops"], 0, report["compared"])
        # Nothing differed: no step was recorded again.
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "sentinel-all", "full")))

    def test_under_the_sentinel_the_resume_step_is_found_then_recorded_in_full(self):
        report, resume = self.resume("sentinel-rng",
                                     ["--sentinel", *self.loop_flags("s-rng", omit="rng")],
                                     LOOP + ["--steps", str(STEPS)], 1)
        s = report["sentinel"]
        self.assertEqual((s["step"], s["full_steps"], s["came_back"]),
                         (STOP, f"{STOP - 1}-{STOP}", True), s)
        self.assertIn(f"detaudit resume --at {STOP} --steps {STOP - 1}-", s["command"])
        # The report is the full recording's: the resumed process found by what it read, its
        # first step's op the random draw the missing generator made.
        self.assertIn(f"read at step {STOP} only", resume["found_by"])
        self.assertEqual(resume["missing"], "torch's CPU generator", resume)
        f = report["first_divergence"]
        self.assertEqual((f["class"], f["step"], f["op"]), ("rng-state", STOP, "aten::bernoulli_"),
                         f)
        # Its later steps, watched by the sentinel in both, read alike: one's first step in full
        # does not change how its loss is recorded after.
        self.assertEqual(report["structural_differences"]["count"], 0,
                         report["structural_differences"])

    def test_a_resume_that_cannot_load_its_checkpoint_says_why_and_keeps_the_traces(self):
        out = os.path.join(self.tmp, "no-checkpoint")
        r = run_detaudit(["resume", "--out", out, "-q", "--at", str(STOP), "--stop-args",
                          f"--stop-at {STOP} --save {os.path.join(self.tmp, 'saved.pt')}",
                          "--resume-args", "--resume nowhere.pt", "--", *LOOP])
        self.assertEqual(r.returncode, 4, r.stdout + r.stderr)
        self.assertIn(f"the program stopped at step {STOP} and resumed failed; check that "
                      "--resume-args load what --stop-args saved", r.stderr)
        self.assertIn("No such file or directory: 'nowhere.pt'", r.stderr)
        for kept in ("run-0/streams/r0.main.t-main.dtr", "run-1/streams/r0.main.t-main.dtr"):
            self.assertTrue(os.path.getsize(os.path.join(out, kept)) > 0, kept)

    def test_the_steps_chosen_are_the_runs_steps_in_the_resumed_process(self):
        # Steps 2-4: the stopped process records its step 2, the resumed one its first two
        # (the run's 3 and 4), not its own steps 2-4.
        report, resume = self.resume("steps", ["--steps", f"{STOP - 1}-{STOP + 1}",
                                               *self.loop_flags("steps", omit="rng")],
                                     LOOP + ["--steps", str(STEPS)], 1)
        self.assertIn(f"read at step {STOP} only", resume["found_by"])
        self.assertEqual(resume["missing"], "torch's CPU generator", resume)
        f = report["first_divergence"]
        self.assertEqual((f["class"], f["step"]), ("rng-state", STOP), f)
        self.assertEqual([p["step"] for p in report["spread"]["per_step"]], [STOP, STOP + 1],
                         report["spread"])
        streams = {s["name"]: s["compared"] for s in report["streams"]}
        self.assertGreater(streams["r0.main.t-main"], 0, streams)  # step 2, before the resume

    @unittest.skipUnless(_HAS_LIGHTNING, "lightning is not installed")
    def test_lightning_with_no_argument(self):
        report, resume = self.resume(
            "lightning", ["--at", "4"], LIGHTNING + ["--out", os.path.join(self.tmp, "lo")], 1)
        self.assertEqual(resume["step"], 4, resume)
        self.assertEqual(resume["missing"], "torch's CPU generator", resume)

    @unittest.skipUnless(_HAS_LIGHTNING, "lightning is not installed")
    def test_lightning_optimized_by_hand_with_a_model_checkpoint(self):
        # Its own ModelCheckpoint saves into a new temp dir in each process: the resumed one
        # still loads the checkpoint of step 4 from the run directory.
        flags = ["--out", os.path.join(self.tmp, "lm"), "--manual", "--model-checkpoint"]
        report, resume = self.resume("lightning-manual", ["--at", "4"], LIGHTNING + flags, 1)
        self.assertEqual((resume["step"], resume["missing"]), (4, "torch's CPU generator"), resume)
        self.assertEqual(report["first_divergence"]["class"], "rng-state",
                         report["first_divergence"])
        report, resume = self.resume("lightning-manual-rng", ["--at", "4"],
                                     LIGHTNING + flags + ["--save-rng"], 0)
        self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))
        self.assertEqual((resume["step"], resume["verified"]), (4, True), resume)

    @unittest.skipUnless(_HAS_TRANSFORMERS, "transformers and accelerate are not installed")
    def test_trainer_with_no_argument(self):
        # Does training continue exactly? It does: `resume` passes, its logged loss sum noted.
        # Its output_dir is a new temp dir in each process: the resumed one loads the checkpoint
        # the stopped one left in the run directory.
        report, resume = self.resume("trainer", ["--at", "4"], TRAINER, 0)
        self.assertEqual(resume["step"], 4, resume)
        self.assertTrue(resume["missing"].startswith("a running value"), resume)
        self.assertEqual(report["spread"]["parameters_diverged"], [], report["spread"])
        self.assertEqual((report["gate"]["fail_on"], report["exit_code"]), ("training", 0),
                         report["gate"])
        self.assertTrue(resume["training_verified"], resume)
        self.assertTrue(report["training"]["identical"], report["training"])
        self.assertTrue(any(o.startswith("aten::add_ (step 4)")
                            for o in report["training"]["outside"]), report["training"])
        # Asked for any difference, the same resume fails on the logged sum.
        r = run_detaudit(["diff", os.path.join(self.tmp, "trainer", "run-0"),
                          os.path.join(self.tmp, "trainer", "run-1")])
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertTrue(os.path.isdir(os.path.join(self.tmp, "trainer", "resume-checkpoint",
                                                   "trainer")))

    @unittest.skipUnless(_HAS_TRANSFORMERS, "transformers and accelerate are not installed")
    def test_a_trainer_checkpoint_of_the_model_only_is_named_by_what_differs_first(self):
        # save_only_model=True leaves the generators, the optimizer and the scheduler out: the
        # dropout of the resume step draws first.
        report, resume = self.resume("trainer-model-only", ["--at", "4"],
                                     TRAINER + ["--save-only-model"], 1)
        self.assertEqual((resume["step"], resume["missing"]), (4, "torch's CPU generator"), resume)
        f = report["first_divergence"]
        self.assertEqual((f["class"], f["step"], f["phase"]), ("rng-state", 4, "forward"), f)
        self.assertIn("save_only_model=True", f["remedy"])
        self.assertFalse(report["training"]["identical"], report["training"])

    @unittest.skipUnless(_HAS_TRANSFORMERS, "transformers and accelerate are not installed")
    def test_trainer_logging_and_evaluating_into_a_temp_dir_resumes_bit_for_bit(self):
        # Logged every 2 steps, its loss sum starts again at the resume step in both runs.
        report, resume = self.resume("trainer-eval", ["--at", "4"], TRAINER + ["--evaluate"], 0)
        self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))
        self.assertEqual((resume["step"], resume["verified"], resume["training_verified"]),
                         (4, True, True), resume)


if __name__ == "__main__":
    unittest.main()
