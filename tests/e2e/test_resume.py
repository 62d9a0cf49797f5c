"""A run stopped and resumed from a checkpoint, diffed against the run that ran through
(issue 60): `detaudit record` twice, then `detaudit diff`, as a user does.

The plain loop (programs/resume_loop.py) saves everything, or leaves out torch's generator,
the data loader's place (with and without DataLoader workers), the scheduler, the GradScaler,
the parameters or the optimizer's state; the resume matrix's loop also NumPy's or Python's
generator, the epoch, BatchNorm's buffers or an EMA of the weights. Each diff finds the resumed process, the step it resumed at from the tensors it
read, and names what the checkpoint did not restore at that step; the complete checkpoint is
identical, the resume verified. Two DDP ranks resume the same way. The loops users run
(Trainer, Lightning, accelerate, `detaudit resume`) are in test_resume_loops.py.

    cd build && ctest -R e2e.*test_resume --output-on-failure
"""
import os
import shlex
import unittest

from detaudit_testlib import (HAS_COMPILE, PYTHON, TORCH_VERSION, TmpDirCase, export_ops,
                              in_parallel, load_report, program, python_answer, run_detaudit)

LOOP = [PYTHON, program("resume_loop.py")]
STEPS, STOP = 6, 3
TRAINER = [PYTHON, program("hf_resume.py")]
DDP = [PYTHON, program("resume_ddp.py")]
LIGHTNING = [PYTHON, program("lightning_resume.py")]
_HAS_LIGHTNING = python_answer(
    "import importlib.util as u;print(bool(u.find_spec('lightning')))") == "True\n"
_HAS_CPU_SCALER = python_answer(
    "import torch;print(hasattr(torch, 'amp') and hasattr(torch.amp, 'GradScaler'))") == "True\n"
_HAS_TRANSFORMERS = python_answer(
    "import importlib.util as u;print(all(u.find_spec(m) for m in ('transformers', 'accelerate')))"
) == "True\n"


def record(out, command):
    run_detaudit(["record", "--out", out, "--", *command], check=0)
    return out


def record_stopped_and_resumed(out, program, stop, resume):
    """`program + stop`, then `program + resume`, recorded as one job: `sh -c "... && ..."`."""
    def words(extra):
        return " ".join(shlex.quote(a) for a in program + extra)
    return record(out, ["sh", "-c", f"{words(stop)} && {words(resume)}"])


def diff_report(case, run_a, run_b, out, expect):
    """`detaudit diff RUN_A RUN_B` as JSON into `out`, its exit code checked; the report."""
    r = run_detaudit(["diff", run_a, run_b, "--format", "json", "-o", out])
    case.assertEqual(r.returncode, expect, r.stdout + r.stderr)
    return load_report(out)


class Resume(TmpDirCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.through = record(os.path.join(cls.tmp, "through"), LOOP + ["--steps", str(STEPS)])
        cls.recorded = {}

    def resumed(self, omit):
        """The resumed run whose checkpoint leaves out `omit`, recorded once."""
        if omit not in self.recorded:
            self.recorded[omit] = self.record_resumed(omit)
        return self.recorded[omit]

    def record_resumed(self, omit):
        ck = os.path.join(self.tmp, f"ck-{omit or 'all'}.pt")
        flags = ["--steps", str(STEPS), "--omit", omit]
        return record_stopped_and_resumed(os.path.join(self.tmp, f"resumed-{omit or 'all'}"), LOOP,
                                          flags + ["--stop-at", str(STOP), "--save", ck],
                                          flags + ["--resume", ck])

    def diff(self, omit, expect):
        report = diff_report(self, self.through, self.resumed(omit),
                             os.path.join(self.tmp, f"report-{omit or 'all'}.json"), expect)
        self.assertEqual(len(report["resumes"]), 1, report["notes"])
        resume = report["resumes"][0]
        self.assertEqual(resume["run"], "B", resume)
        self.assertEqual(resume["process"], "r0.main~1", resume)
        self.assertEqual(resume["continues"], "r0.main", resume)
        self.assertEqual(resume["step"], STOP, resume)
        self.assertIn(f"read at step {STOP} only", resume["found_by"])
        self.assertGreater(resume["setup_ops"], 0, resume)
        return report, resume

    def test_a_complete_checkpoint_resumes_bit_for_bit(self):
        report, resume = self.diff("", 0)
        self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))
        self.assertTrue(resume["verified"], resume)
        self.assertIsNone(resume["missing"], resume)
        # The resumed part was compared, not passed over: both processes' streams were.
        names = {s["name"]: s for s in report["streams"]}
        self.assertGreater(names["r0.main~1.t-main"]["compared"], 0, names)
        self.assertGreater(names["r0.main.t-main"]["compared"], 0, names)

    def test_a_generator_not_saved_is_named_at_the_resume_step(self):
        report, resume = self.diff("rng", 1)
        f = report["first_divergence"]
        self.assertEqual(f["class"], "rng-state", f)
        self.assertEqual(f["stream"], "r0.main~1.t-main", f)
        self.assertEqual(f["step"], STOP, f)
        self.assertEqual(resume["missing"], "torch's CPU generator", resume)
        self.assertFalse(resume["verified"], resume)
        self.assertIn("did not restore torch's CPU generator", f["cause"])
        self.assertIn("torch.get_rng_state()", f["remedy"])

    def test_a_data_loader_started_over_is_named_with_the_step_it_repeats(self):
        report, resume = self.diff("sampler", 1)
        f = report["first_divergence"]
        # The index the batch is taken with is made by earlier ops (a slice of the permutation);
        # what the resumed loop read is a batch the other run read before: data entering the
        # program, as the class table has it.
        self.assertEqual(f["class"], "external-input", f)
        self.assertTrue(f["data_order"], f)
        self.assertEqual(f["step"], STOP, f)
        self.assertEqual(resume["missing"], "the data order", resume)
        self.assertIn(f"run B's step {STOP} read the batch run A read at step 0", f["cause"])

    def test_a_scheduler_not_saved_is_named_by_its_hyperparameter(self):
        report, resume = self.diff("scheduler", 1)
        f = report["first_divergence"]
        # The step it resumed at ran on the optimizer's restored LR; the scheduler's step after it
        # set the next one from its own count, which started over.
        self.assertEqual(f["step"], STOP + 1, f)
        self.assertEqual(f["phase"], "optimizer", f)
        self.assertIn("hyperparameter", resume["missing"] or "", (resume, f))
        self.assertIn("state_dict()", f["remedy"])

    def test_parameters_not_loaded_are_named_not_taken_for_the_data_order(self):
        # The fresh model's bias, as the addmm reads it, is what run A read at step 0, as a
        # batch started over would be: the parameters the optimizer left are what tells.
        report, resume = self.diff("model", 1)
        f = report["first_divergence"]
        self.assertEqual(f["step"], STOP, f)
        self.assertEqual(resume["missing"], "the parameters", resume)
        self.assertIn("resumed process read none of them", f["cause"])
        self.assertIn("load the model's state_dict()", f["remedy"])

    def test_an_optimizers_state_not_restored_is_named_by_its_role(self):
        # Adam, resumed without its state_dict(): its step count, what only its steps write and
        # read, is 0 where the run that went through has 3; its moments start anew too.
        through = record(os.path.join(self.tmp, "through-adam"),
                         LOOP + ["--steps", str(STEPS), "--adam"])
        ck = os.path.join(self.tmp, "ck-adam.pt")
        flags = ["--steps", str(STEPS), "--adam", "--omit", "optimizer"]
        resumed = record_stopped_and_resumed(os.path.join(self.tmp, "resumed-adam"), LOOP,
                                             flags + ["--stop-at", str(STOP), "--save", ck],
                                             flags + ["--resume", ck])
        report = diff_report(self, through, resumed, os.path.join(self.tmp, "adam.json"), 1)
        resume = report["resumes"][0]
        self.assertEqual((resume["step"], resume["missing"]), (STOP, "the optimizer's state"),
                         resume)
        self.assertFalse(resume["training_verified"], resume)
        f = report["first_divergence"]
        self.assertEqual((f["step"], f["phase"]), (STOP, "optimizer"), f)
        self.assertEqual([p.get("tensor_role") for p in f["inputs"] if p["differs"]],
                         ["optimizer state"], f["inputs"])
        self.assertTrue(f["reaches_training"], f)
        # torch 2's optimizer hooks name the optimizer; torch 1.13 has none to name it by.
        whose = "Adam's state" if f["optimizer"] else "the optimizer's state"
        if f["optimizer"]:
            self.assertEqual(f["optimizer"]["class"], "Adam", f)
        self.assertIn(f"did not restore the optimizer's state: {whose}", f["cause"])
        self.assertNotIn("running value", f["cause"])
        self.assertIn("optimizer.load_state_dict()", f["remedy"])
        self.assertFalse(report["training"]["identical"], report["training"])
        self.assertGreater(len(report["spread"]["parameters_diverged"]), 0, report["spread"])

    def test_the_resumed_run_may_be_run_a(self):
        out = os.path.join(self.tmp, "swapped.json")
        r = run_detaudit(["diff", self.resumed(""), self.through, "--format", "json", "-o", out])
        self.assertEqual(r.returncode, 0, r.stderr)
        report = load_report(out)
        self.assertEqual([x["run"] for x in report["resumes"]], ["A"], report["resumes"])
        self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))

    def test_a_resume_that_loads_nothing_hides_the_step_until_it_is_given(self):
        # Neither the parameters, the optimizer's state, the batches nor the dropout masks it
        # read are what run A read at the resume step: its first step is run A's step 0 again.
        # (Each of them alone tells the step, the generator's masks included.)
        resumed = self.resumed("model,optimizer,sampler,rng")
        out = os.path.join(self.tmp, "model.json")
        r = run_detaudit(["diff", self.through, resumed, "--format", "json", "-o", out])
        self.assertEqual(r.returncode, 1, r.stderr)
        report = load_report(out)
        self.assertEqual(report["resumes"], [])
        self.assertTrue(any("--resume-step" in n for n in report["notes"]), report["notes"])
        r = run_detaudit(["diff", self.through, resumed, "--resume-step", str(STOP),
                          "--format", "json", "-o", out])
        self.assertEqual(r.returncode, 1, r.stderr)
        report = load_report(out)
        resume = report["resumes"][0]
        self.assertEqual((resume["step"], resume["found_by"]), (STOP, "--resume-step"), resume)
        f = report["first_divergence"]
        self.assertEqual((f["stream"], f["step"]), ("r0.main~1.t-main", STOP), f)


_NOTES_PYTHON_GENERATORS = unittest.skipUnless(
    HAS_COMPILE, f"torch {TORCH_VERSION} has no global optimizer step hooks, by which NumPy's and "
    "Python's generators are noted (torch 2.0+)")


class ResumeMatrix(TmpDirCase):
    """The plain loop with what a checkpoint can also miss: noise from NumPy's generator on each
    batch and a factor from Python's `random`, epochs of two batches each drawn in an order seeded
    by the epoch, a BatchNorm, and an EMA of the weights updated after each step with autograd
    off. One run through; one stopped and resumed run per piece left out, recorded side by side.
    Each is named at the resume step by what it is: where the batch alone would pass for a loader
    started over (NumPy's noise repeats step 0's), a hyperparameter (Python's factor is a float
    argument), torch's generator (the epoch's order), a logged sum (BatchNorm's count) or the
    data order (the EMA, which reads the weights)."""

    OMIT = ["", "epoch", "buffers", "ema"] + (["numpy", "random"] if HAS_COMPILE else [])

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.flags = ["--steps", str(STEPS), "--numpy-noise", "--python-noise",
                     "--epoch-batches", "2", "--batchnorm", "--ema"]

        def resumed(omit):
            ck = os.path.join(cls.tmp, f"ck-{omit or 'all'}.pt")
            flags = cls.flags + ["--omit", omit]
            return lambda: record_stopped_and_resumed(
                os.path.join(cls.tmp, f"resumed-{omit or 'all'}"), LOOP,
                flags + ["--stop-at", str(STOP), "--save", ck], flags + ["--resume", ck])

        runs = in_parallel([lambda: record(os.path.join(cls.tmp, "through"), LOOP + cls.flags)] +
                           [resumed(omit) for omit in cls.OMIT])
        cls.through, cls.resumed = runs[0], dict(zip(cls.OMIT, runs[1:]))

    def named(self, omit, missing, klass, step=STOP):
        report = diff_report(self, self.through, self.resumed[omit],
                             self.resumed[omit] + ".json", 1)
        resume = report["resumes"][0]
        self.assertEqual(resume["step"], STOP, resume)
        self.assertTrue((resume["missing"] or "").startswith(missing), (resume, report["notes"]))
        f = report["first_divergence"]
        self.assertEqual((f["class"], f["step"], f["stream"]), (klass, step, "r0.main~1.t-main"),
                         f["cause"])
        self.assertFalse(resume["verified"], resume)
        return report, f

    def test_a_complete_checkpoint_resumes_bit_for_bit(self):
        report = diff_report(self, self.through, self.resumed[""], self.resumed[""] + ".json", 0)
        self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))
        self.assertTrue(report["resumes"][0]["verified"], report["resumes"])

    @_NOTES_PYTHON_GENERATORS
    def test_numpys_generator_not_saved_is_named_not_taken_for_the_data_order(self):
        _, f = self.named("numpy", "NumPy's generator", "rng-state")
        self.assertIn("the checkpoint did not restore NumPy's generator", f["cause"])
        self.assertIn("numpy.random.get_state() and random.getstate()", f["remedy"])

    @_NOTES_PYTHON_GENERATORS
    def test_pythons_generator_not_saved_is_named_not_taken_for_a_hyperparameter(self):
        _, f = self.named("random", "Python's generator", "rng-state")
        self.assertIn("the checkpoint did not restore Python's generator", f["cause"])

    def test_an_epoch_not_saved_is_named_not_taken_for_torchs_generator(self):
        # The order of epoch 1 is drawn with a generator seeded by the epoch; torch's default
        # generator (the dropout's) was restored and agrees after the resume step.
        _, f = self.named("epoch", "what seeds a generator of the program's own", "rng-state")
        self.assertEqual(f["op"], "aten::randperm", f)
        self.assertIn("the state run A's aten::randperm drew with at step 0", f["cause"])
        self.assertIn("sampler.set_epoch(epoch)", f["remedy"])

    def test_batchnorms_buffers_not_loaded_are_named_a_count_not_a_logged_sum(self):
        report, f = self.named("buffers", "a count kept in a tensor", "input-differs")
        self.assertIn("num_batches_tracked", f["cause"])
        self.assertIn("strict=True", f["remedy"])
        # Its running statistics are a model buffer, training state: their writes are compared
        # (their schema leaves them unmarked), so training is not the same.
        self.assertFalse(report["training"]["identical"], report["training"])

    def test_an_ema_not_saved_is_named_outside_training_not_taken_for_the_data_order(self):
        # Updated after the optimizer's step, the EMA's ops count in the next one.
        report, f = self.named("ema", "a value kept outside training with autograd off",
                               "input-differs", step=STOP + 1)
        self.assertEqual([p.get("tensor_role") for p in f["inputs"] if p["differs"]],
                         ["evaluation"], f["inputs"])
        self.assertTrue(report["training"]["identical"], report["training"])
        self.assertIn("training continues exactly", f["cause"])
        self.assertIn("its own state_dict()", f["remedy"])

    def test_batchnorms_running_statistics_are_recorded_as_they_change(self):
        # The kernel's schema does not mark them written: each step's are its own bytes.
        ops = [o for o in export_ops(self.through) if o["name"] == "aten::native_batch_norm"]
        self.assertEqual(len(ops), STEPS, [o["step"] for o in ops])
        means = [o["written"]["running_mean"]["digest"] for o in ops]
        self.assertEqual(len(set(means)), STEPS, means)
        read = [o["inputs"][3]["digest"] for o in ops]
        self.assertEqual(read[1:], means[:-1])


class LoaderResume(TmpDirCase):
    """The plain loop taking its batches from a DataLoader with 2 workers, and, where torch has
    a GradScaler for the CPU (2.3+), scaling its loss with one whose scale doubles each step.
    The resumed process's loader hands its first batch out from worker 0, which made another
    batch in run A: its workers are set aside, their batches compared where the main thread
    reads them. A scaler left out scales the loss by the initial scale; a power-of-two scale
    cancels when the gradients are unscaled, so training agrees and only the scale tells."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # Each sample's noise drawn from a generator seeded by its index: it resumes exactly.
        cls.flags = ["--steps", str(STEPS), "--workers", "2", "--augment", "seeded"] + (
            ["--scaler"] if _HAS_CPU_SCALER else [])
        cls.through = record(os.path.join(cls.tmp, "through"), LOOP + cls.flags)

    def diff(self, omit, expect):
        ck = os.path.join(self.tmp, f"ck-{omit or 'all'}.pt")
        flags = self.flags + ["--omit", omit]
        resumed = record_stopped_and_resumed(os.path.join(self.tmp, f"resumed-{omit or 'all'}"),
                                             LOOP, flags + ["--stop-at", str(STOP), "--save", ck],
                                             flags + ["--resume", ck])
        report = diff_report(self, self.through, resumed,
                             os.path.join(self.tmp, f"loader-{omit or 'all'}.json"), expect)
        self.assertEqual([(x["process"], x["step"]) for x in report["resumes"]],
                         [("r0.main~1", STOP)], (report["resumes"], report["notes"]))
        resume = report["resumes"][0]
        self.assertEqual(sorted(resume["workers"]), ["r0.main.0~1", "r0.main.1~1"], resume)
        self.assertEqual(report["not_compared"], [])
        return report, resume

    def test_a_complete_checkpoint_resumes_with_its_workers(self):
        report, resume = self.diff("", 0)
        self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))
        self.assertTrue(resume["verified"], resume)

    def test_a_loader_started_over_is_named_where_its_batch_is_read(self):
        report, resume = self.diff("sampler", 1)
        f = report["first_divergence"]
        self.assertEqual((f["stream"], f["step"]), ("r0.main~1.t-main", STOP), f)
        self.assertEqual(resume["missing"], "the data order", resume)
        self.assertIn(f"run B's step {STOP} read the batch run A read at step 0", f["cause"])

    @unittest.skipUnless(_HAS_CPU_SCALER, "this torch has no GradScaler for the CPU (torch 2.3+)")
    def test_a_scaler_not_saved_is_named_by_its_scale(self):
        report, resume = self.diff("scaler", 1)
        f = report["first_divergence"]
        self.assertEqual((f["step"], f["op"]), (STOP, "aten::mul"), f)
        self.assertEqual(resume["missing"], "the GradScaler's scale", resume)
        # The initial scale, 2**8, against the scale doubled at each of the steps before.
        self.assertIn(f"is 256 in run B's resumed process and {256 << STOP} in run A", f["cause"])
        self.assertIn("aten::_amp_update_scale_", f["cause"])
        self.assertIn("scaler.load_state_dict()", f["remedy"])
        self.assertEqual(report["spread"]["parameters_diverged"], [], report["spread"])


class WorkerDraws(TmpDirCase):
    """The loader with 2 workers whose Dataset draws each sample's noise from the worker's own
    generator: a loader made at the resume seeds its workers anew, and no checkpoint holds
    their generators. What the resumed process read is named as what the workers draw."""

    def test_an_augmentation_drawn_in_the_workers_is_named(self):
        flags = ["--steps", str(STEPS), "--workers", "2", "--augment", "drawn"]
        ck = os.path.join(self.tmp, "ck.pt")
        through, resumed = in_parallel([
            lambda: record(os.path.join(self.tmp, "through"), LOOP + flags),
            lambda: record_stopped_and_resumed(os.path.join(self.tmp, "resumed"), LOOP,
                                               flags + ["--stop-at", str(STOP), "--save", ck],
                                               flags + ["--resume", ck])])
        report = diff_report(self, through, resumed, os.path.join(self.tmp, "drawn.json"), 1)
        resume = report["resumes"][0]
        self.assertEqual(resume["step"], STOP, resume)
        self.assertTrue(resume["missing"].startswith("what the DataLoader's workers draw"),
                        resume)
        f = report["first_divergence"]
        self.assertEqual((f["step"], f["stream"]), (STOP, "r0.main~1.t-main"), f)
        self.assertEqual([p.get("tensor_role") for p in f["inputs"] if p["differs"]], ["batch"],
                         f["inputs"])
        self.assertIn("seeds its workers' generators anew", f["cause"])
        self.assertIn("StatefulDataLoader", f["remedy"])


class PersistentWorkers(TmpDirCase):
    """The loader's 2 workers kept across epochs of 2 batches (persistent_workers=True, the
    loader iterated anew each epoch), resumed at step 3, mid-epoch: in the run through the
    workers live on from epoch 0, in the resumed process they are made anew. With each sample's
    noise seeded by its index, the resume is bit for bit; drawn from the workers' generators,
    which went on from epoch 0 in the run through, it is named as what the workers draw."""

    AUGMENT = ["seeded", "drawn"]

    @classmethod
    def setUpClass(cls):
        super().setUpClass()

        def pair(augment):
            flags = ["--steps", str(STEPS), "--workers", "2", "--epoch-batches", "2",
                     "--persistent", "--augment", augment]
            ck = os.path.join(cls.tmp, f"ck-{augment}.pt")
            return [lambda: record(os.path.join(cls.tmp, f"through-{augment}"), LOOP + flags),
                    lambda: record_stopped_and_resumed(
                        os.path.join(cls.tmp, f"resumed-{augment}"), LOOP,
                        flags + ["--stop-at", str(STOP), "--save", ck], flags + ["--resume", ck])]

        runs = in_parallel([job for augment in cls.AUGMENT for job in pair(augment)])
        cls.runs = {a: (runs[2 * i], runs[2 * i + 1]) for i, a in enumerate(cls.AUGMENT)}

    def diff(self, augment, expect):
        through, resumed = self.runs[augment]
        report = diff_report(self, through, resumed, resumed + ".json", expect)
        self.assertEqual([(x["process"], x["step"]) for x in report["resumes"]],
                         [("r0.main~1", STOP)], (report["resumes"], report["notes"]))
        resume = report["resumes"][0]
        self.assertEqual(sorted(resume["workers"]), ["r0.main.0~1", "r0.main.1~1"], resume)
        return report, resume

    def test_workers_kept_across_an_epoch_resume_bit_for_bit(self):
        report, resume = self.diff("seeded", 0)
        self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))
        self.assertTrue(resume["verified"], resume)
        # Every batch of the epochs after the resume was compared where it was read.
        self.assertGreaterEqual(report["compared"]["steps"], STEPS, report["compared"])

    def test_what_kept_workers_drew_is_named(self):
        report, resume = self.diff("drawn", 1)
        self.assertTrue(resume["missing"].startswith("what the DataLoader's workers draw"),
                        resume)
        f = report["first_divergence"]
        self.assertEqual((f["step"], f["stream"]), (STOP, "r0.main~1.t-main"), f)


class DdpResume(TmpDirCase):
    """Two DDP ranks over gloo (programs/resume_ddp.py), each saving its own generator beside
    the shared model and optimizer. A fresh process's first iteration fills DDP's gradient
    bucket in parameter order, and its second rebuilds the bucket in the order gradients became
    ready (a broadcast from rank 0): the resumed ranks' all-reduce reads the same values in
    another order at the resume step. That is said, not counted; a generator left out is named."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.through = record(os.path.join(cls.tmp, "through"), DDP + ["--steps", str(STEPS)])

    def resume(self, omit, expect):
        ck = os.path.join(self.tmp, f"ck-{omit or 'all'}")
        flags = ["--steps", str(STEPS), "--omit", omit]
        resumed = record_stopped_and_resumed(os.path.join(self.tmp, f"resumed-{omit or 'all'}"),
                                             DDP, flags + ["--stop-at", str(STOP), "--save", ck],
                                             flags + ["--resume", ck])
        report = diff_report(self, self.through, resumed,
                             os.path.join(self.tmp, f"ddp-{omit or 'all'}.json"), expect)
        resumes = {x["continues"]: x for x in report["resumes"]}
        self.assertEqual(sorted(resumes), ["r0.main", "r1.main"], report["resumes"])
        for before, x in resumes.items():
            # The launcher's own process takes a name too: the ranks are "~1" or "~2".
            self.assertRegex(x["process"], "^" + before.replace(".", r"\.") + "~[12]$", x)
            self.assertEqual((x["run"], x["step"]), ("B", STOP), x)
        self.assert_split_diff_agrees(resumed, report, expect)
        return report, resumes

    def assert_split_diff_agrees(self, resumed, whole, expect):
        """The diff split by ranks (--part, merge) finds the same resumes and verdict."""
        parts = []
        for rank in (0, 1):
            parts.append(os.path.join(self.tmp, f"part{rank}-{os.path.basename(resumed)}.json"))
            run_detaudit(["diff", self.through, resumed, "--ranks", str(rank), "--part",
                          parts[-1]], check=0)
        out = parts[0] + ".merged.json"
        r = run_detaudit(["merge", *parts, "--format", "json", "-o", out])
        self.assertEqual(r.returncode, expect, r.stdout + r.stderr)
        merged = load_report(out)
        self.assertEqual(merged["verdict"], whole["verdict"], merged.get("first_divergence"))
        key = lambda x: x["process"]
        self.assertEqual(sorted(merged["resumes"], key=key), sorted(whole["resumes"], key=key))
        if whole["first_divergence"]:
            self.assertEqual(merged["first_divergence"]["cause"],
                             whole["first_divergence"]["cause"])

    def test_a_complete_checkpoint_resumes_both_ranks_bit_for_bit(self):
        report, resumes = self.resume("", 0)
        self.assertEqual(report["verdict"], "identical", report["notes"])
        for x in resumes.values():
            self.assertTrue(x["verified"], x)
            self.assertGreaterEqual(x["reordered_ops"], 1, x)
        reordered = [n for n in report["notes"] if "held the same values as run A's in another "
                     "order" in n]
        self.assertEqual(len(reordered), 2, report["notes"])
        self.assertTrue(all("c10d::allreduce_" in n for n in reordered), reordered)
        self.assertTrue(any("ops run in its second only" in n for n in report["notes"]),
                        report["notes"])
        spread = report["spread"]
        self.assertGreater(spread["parameters_tracked"], 0, spread)
        self.assertEqual(spread["parameters_diverged"], [], spread)

    def test_an_optimizers_state_not_loaded_is_named_past_the_buckets_laid_out_anew(self):
        # Each resumed rank's first bucket holds the same values in another order, and SGD's
        # momentum starts over: the bucket is said, the optimizer's state is what was missed.
        report, resumes = self.resume("optimizer", 1)
        f = report["first_divergence"]
        self.assertEqual((f["step"], f["phase"]), (STOP, "optimizer"), f)
        resumed = next(x for x in resumes.values() if f["stream"].startswith(x["process"] + "."))
        self.assertEqual(resumed["missing"], "the optimizer's state", resumed)
        self.assertIn("the checkpoint did not restore the optimizer's state", f["cause"])
        for x in resumes.values():
            self.assertGreaterEqual(x["reordered_ops"], 1, x)

    def test_a_rank_generator_not_saved_is_named(self):
        report, resumes = self.resume("rng", 1)
        f = report["first_divergence"]
        self.assertEqual((f["class"], f["step"]), ("rng-state", STOP), f)
        resumed = next(x for x in resumes.values() if f["stream"].startswith(x["process"] + "."))
        self.assertEqual(resumed["missing"], "torch's CPU generator", resumed)
        self.assertFalse(resumed["verified"], resumed)
        self.assertEqual(resumed["reordered_ops"], 0, resumed)


if __name__ == "__main__":
    unittest.main()
