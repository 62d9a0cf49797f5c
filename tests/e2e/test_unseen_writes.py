"""Writes the recorder must see: what an op writes beside what it returns (the foreach and fused
optimizers' lists), and what torch.compile's generated kernels write. Never a verdict from bytes
described before such a write.

- The write set over the operator registry: every schema torch knows with a mutable argument,
  single or list, parsed by the interposer's own reading (`detaudit_replay --write-sets`).
- The detector recall matrix (programs/optimizer_matrix.py): every torch.optim optimizer in each
  implementation this torch has on the CPU, GradScaler, clip_grad_norm_, an EMA and a scheduler,
  with one gradient element scaled by 1.001 at one step of each cell in one run. Full recording,
  --sentinel and the device digest (through the host queue) must each find every cell at that
  step and no step before it; the same program unplanted stays identical in each mode.
- torch.compile (torch 2.x): a kernel rewriting a buffer an extern kernel wrote is recorded with
  the bytes the program holds, kernels recorded or not, and a race in such a kernel is named at
  it (or at its region when kernels are not recorded), never at a later reader.
- Hugging Face Trainer (where transformers is installed): its default fused AdamW under
  --sentinel finds a late race at its step and names the op.

    cd tests/e2e && ../../.venv/bin/python -m unittest -v test_unseen_writes
"""
import json
import os
import re
import subprocess
import unittest

from detaudit_testlib import (HAS_COMPILE, HOOKS, PYTHON, TORCH_VERSION, audit, divergent_steps,
                              export_records, in_parallel, make_temp_dir, ops, output_log,
                              params_sha, planted_audit, program, python_answer, remove_dir,
                              run_detaudit, sleeping_waits, warm_compile_cache)

MATRIX = program("optimizer_matrix.py")
RACE = [PYTHON, program("compiled_writes.py"), "--case", "race"]
MODES = {"full": [], "sentinel": ["--sentinel"],
         "device": ["--digest", "device", "--env", "DETAUDIT_DEVICE_QUEUE=host"]}
ATTEMPTS = 3  # a race on float atomics may leave the bits alone in a pair: pairs tried at most

_HAS_TRANSFORMERS = python_answer(
    "import importlib.util as u;print(all(u.find_spec(m) for m in ('transformers', 'accelerate')))"
) == "True\n"


class WriteSets(unittest.TestCase):
    """Every schema in torch's registry with a mutable argument: the interposer's write set holds
    exactly those arguments, and each one the op does not return is in its written section."""

    def test_every_mutable_argument_is_in_the_write_set(self):
        schemas = subprocess.run(
            [PYTHON, "-c", "import torch\nfor s in torch._C._jit_get_all_schemas(): print(s)"],
            capture_output=True, text=True, check=True).stdout
        replayer = os.path.join(os.path.dirname(HOOKS), "detaudit_replay")
        out = subprocess.run([replayer, "--write-sets"], input=schemas, capture_output=True,
                             text=True, check=True).stdout
        got = {}
        for line in out.splitlines():
            name, *sets = line.split("\t")
            got[name] = None if sets == ["unparsed"] else \
                tuple({int(i) for i in s.split(",") if i} for s in sets)
        expect = subprocess.run([PYTHON, "-c", _EXPECTED_WRITE_SETS], capture_output=True,
                                text=True, check=True).stdout
        checked, problems = 0, []
        for line in expect.splitlines():
            name, mutable, unreturned = line.split("\t")
            mutable = {int(i) for i in mutable.split(",") if i}
            unreturned = {int(i) for i in unreturned.split(",") if i}
            if got.get(name) is None:
                problems.append(f"{name}: not read by the interposer ({got.get(name, 'absent')})")
                continue
            checked += 1
            mutable_got, unreturned_got = got[name]
            if mutable_got != mutable:
                problems.append(f"{name}: write set {sorted(mutable_got)}, schema {sorted(mutable)}")
            # Written arguments not returned are recorded after the op, but for ops that write
            # no bytes (record_stream) or only sizes and strides (as_strided_, t_, ...).
            missing = unreturned - unreturned_got
            if missing and not name.startswith(_WRITES_NO_BYTES):
                problems.append(f"{name}: arguments {sorted(missing)} written, not returned, "
                                f"and not recorded after the op")
            if unreturned_got - unreturned:
                problems.append(f"{name}: {sorted(unreturned_got - unreturned)} recorded as "
                                f"written though returned")
        self.assertEqual(problems, [], f"{len(problems)} of {checked} schemas")
        # torch 1.13 has about 1,450 such schemas, 2.13 about 1,600.
        self.assertGreater(checked, 1000)


_WRITES_NO_BYTES = ("aten::record_stream.", "aten::as_strided_.", "aten::squeeze_.",
                    "aten::unsqueeze_.", "aten::transpose_.", "aten::t_.", "aten::swapdims_.",
                    "aten::swapaxes_.", "aten::detach_.")

# Each schema with a mutable argument, as torch's own Python reads it: its mutable arguments,
# and those no return aliases (a return `-> Tensor(a!)` returns `Tensor(a!) self`).
# Batch norm kernels whose schemas leave the running statistics they update unmarked: the
# interposer reads them as written too (hooks/ops/op_schema.cpp), and so does this.
_EXPECTED_WRITE_SETS = r"""
import torch
UNMARKED = ("aten::native_batch_norm", "aten::cudnn_batch_norm", "aten::miopen_batch_norm",
            "aten::batch_norm_gather_stats_with_counts")
for s in torch._C._jit_get_all_schemas():
    mutable = [i for i, a in enumerate(s.arguments)
               if (a.alias_info is not None and a.alias_info.is_write) or
               (s.name in UNMARKED and a.alias_info is None and
                a.name in ("running_mean", "running_var"))]
    if not mutable:
        continue
    returned = set()
    for r in s.returns:
        if r.alias_info is not None and r.alias_info.is_write:
            returned |= set(r.alias_info.before_set)
    unreturned = [i for i in mutable if s.arguments[i].alias_info is None or
                  not set(s.arguments[i].alias_info.before_set) & returned]
    print(f"{s.name}.{s.overload_name}\t{','.join(map(str, mutable))}\t"
          f"{','.join(map(str, unreturned))}")
"""


class OptimizerMatrix(unittest.TestCase):
    """One gradient element changed at one step of each cell, in one run: found at that step."""

    @classmethod
    @sleeping_waits()
    def setUpClass(cls):
        cls.tmp = make_temp_dir()
        results = in_parallel([lambda mode=mode, flags=flags: planted_audit(
            os.path.join(cls.tmp, mode), [PYTHON, MATRIX], flags) for mode, flags in MODES.items()])
        cls.audits = dict(zip(MODES, results))

    @classmethod
    def tearDownClass(cls):
        remove_dir(cls.tmp)

    def cells(self, mode):
        log = self.audits[mode]["log"]
        cells = [(m[0], int(m[1]), int(m[2]), int(m[3])) for m in
                 re.findall(r"^cell (\S+) steps (\d+)-(\d+) planted (\d+)$", log, re.M)]
        skipped = re.findall(r"^cell (\S+) skipped: (.*)$", log, re.M)
        return cells, skipped

    def check_mode(self, mode):
        r, report = self.audits[mode]["run"], self.audits[mode]["planted"]
        self.assertEqual(r.returncode, 1, r.stdout[-2000:] + r.stderr[-2000:])
        cells, skipped = self.cells(mode)
        # Every optimizer in single-tensor and foreach form, and the training loops' extras;
        # fused on torch 2.x (SGD, Adam, AdamW, Adagrad on the CPU).
        self.assertGreaterEqual(len(cells), 26, skipped)
        steps = divergent_steps(report)
        missed = []
        for name, first, last, planted in cells:
            found = sorted(s for s in steps if first <= s <= last)
            if not found or found[0] != planted:
                missed.append(f"{name}: planted at step {planted}, differences at {found}")
        self.assertEqual(missed, [], f"{mode}: {len(missed)} of {len(cells)} cells")
        clean = self.audits[mode]["clean"]
        self.assertEqual((clean["verdict"], clean["exit_code"]), ("identical", 0),
                         f"{mode}, unplanted: {json.dumps(clean)[:3000]}")
        return cells

    def test_full_recording_finds_every_cell_at_its_step(self):
        self.check_mode("full")

    def test_the_sentinel_finds_every_cell_at_its_step(self):
        self.check_mode("sentinel")
        # What it says when the runs agree names what it compared: tensors the optimizer wrote.
        clean = self.audits["sentinel"]["clean"]
        self.assertGreater(clean["spread"]["parameters_tracked"], 0)

    def test_the_device_digest_finds_every_cell_at_its_step(self):
        self.check_mode("device")

    def test_a_fused_optimizers_written_lists_are_compared(self):
        cells, _ = self.cells("full")
        fused = [c for c in cells if c[0].endswith("/fused")]
        if not fused:
            self.skipTest(f"torch {TORCH_VERSION} has no fused optimizer on the CPU")
        _, first, last, planted = next(c for c in fused if c[0] == "adamw/fused")
        records = export_records(os.path.join(self.audits["full"]["dir"], "run-0"))
        adamw = [o for o in ops(records, "aten::_fused_adamw_") if first <= o["step"] <= last]
        self.assertEqual(len(adamw), last - first + 1)
        written = adamw[0].get("written", {})
        self.assertEqual(sorted(written), ["exp_avg_sqs", "exp_avgs", "grads",
                                           "max_exp_avg_sqs", "self"], adamw[0])
        # The state's digests change every step: its writes are seen.
        states = [tuple(t["digest"] for t in o["written"]["exp_avgs"]) for o in adamw]
        self.assertEqual(len(set(states)), len(states), states)


@unittest.skipUnless(HAS_COMPILE, f"torch {TORCH_VERSION} has no torch.compile")
class CompiledWrites(unittest.TestCase):
    """Bytes a generated kernel writes in place, after an extern kernel wrote them."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = make_temp_dir()
        cls.off = os.path.join(cls.tmp, "kernels-off.json")
        with open(cls.off, "w") as f:
            json.dump({"record": {"compiled_kernels": False}}, f)
        in_place = [PYTHON, program("compiled_writes.py"), "--case", "in-place-kernel"]
        cls.compiled, _ = warm_compile_cache(cls.tmp, in_place, RACE)
        calls = []
        for kernels in ("on", "off"):
            flags = [] if kernels == "on" else ["--config", cls.off]
            out = os.path.join(cls.tmp, f"in-place-{kernels}")
            calls.append(lambda out=out, flags=flags: run_detaudit(
                ["run", "--out", out, "-q", *flags, "--", *in_place], timeout=600,
                env=cls.compiled))
            calls.append(lambda kernels=kernels, flags=flags: cls.record_race(kernels, flags))
        results = in_parallel(calls)
        cls.in_place = {"on": results[0], "off": results[2]}
        cls.race = {"on": results[1], "off": results[3]}

    @classmethod
    def record_race(cls, kernels, flags):
        """Pairs of the racing program until one pair's results differ (ATTEMPTS at most)."""
        tried = []
        for attempt in range(ATTEMPTS):
            out = os.path.join(cls.tmp, f"race-{kernels}-{attempt}")
            r, report = audit(out, RACE, flags, env=cls.compiled)
            logs = [output_log(os.path.join(out, f"run-{i}")) for i in (0, 1)]
            sums = [re.findall(r"^step \d+ md5 \w+$", log, re.M) for log in logs]
            tried.append((r, report, sums[0] != sums[1]))
            if sums[0] != sums[1]:
                break
        return tried

    @classmethod
    def tearDownClass(cls):
        remove_dir(cls.tmp)

    def test_a_kernels_in_place_write_is_recorded_as_the_program_holds_it(self):
        for kernels, r in self.in_place.items():
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            run = os.path.join(self.tmp, f"in-place-{kernels}", "run-0")
            held = re.findall(r"^step \d+ md5 (\w+)$", output_log(run), re.M)
            readers = [o for o in ops(export_records(run), "aten::mul") if o["depth"] == 0]
            recorded = [o["inputs"][0]["digest"] for o in readers]
            self.assertEqual(recorded, held, f"kernels {kernels}: the eager reader's input")

    def test_a_race_in_a_kernel_is_named_there_not_at_a_later_reader(self):
        for kernels, tried in self.race.items():
            for r, report, differ in tried:
                if not differ:  # the bits agreed: no false alarm allowed
                    self.assertEqual(report["verdict"], "identical", kernels)
            r, report, differ = tried[-1]
            if not differ:
                self.fail(f"kernels {kernels}: the atomic adds left the bits alone in "
                          f"{ATTEMPTS} pairs, so the verdict could not be checked")
            fd = report["first_divergence"]
            about = f"kernels {kernels}: " + json.dumps(fd, indent=1)[:3000]
            self.assertEqual(fd["class"], "nondeterministic-op", about)
            self.assertEqual(fd["step"], 0, about)
            if kernels == "on":
                self.assertTrue(fd["op"].startswith("inductor_kernel::cpp_fused_index_put"), about)
                self.assertEqual(fd["catalog"]["id"], "inductor-cpu-atomic-add", about)
                self.assertFalse(any(t["differs"] for t in fd["inputs"]), about)
            else:
                # Opaque: the difference is placed in the region, from the input it made.
                self.assertIn("made inside the compiled region", fd["detail"], about)


@unittest.skipUnless(_HAS_TRANSFORMERS, "transformers and accelerate are not installed")
class TrainerSentinel(unittest.TestCase):
    """A tiny GPT-2 under Trainer's default optimizer (fused AdamW), racing from step 50 of 60."""

    def test_the_sentinel_finds_a_late_race_under_fused_adamw(self):
        tmp = make_temp_dir()
        try:
            for attempt in range(ATTEMPTS):
                out = os.path.join(tmp, f"trainer-{attempt}")
                r, report = audit(out, [PYTHON, program("hf_trainer.py")], ["--sentinel"],
                                  timeout=900)
                logs = [output_log(os.path.join(out, f"run-{i}")) for i in (0, 1)]
                self.assertIn("optimizer AdamW fused=True", logs[0])
                if params_sha(logs[0]) == params_sha(logs[1]):
                    self.assertEqual(report["verdict"], "identical")
                    continue
                about = json.dumps(report.get("sentinel"), indent=1)[:3000]
                self.assertEqual(r.returncode, 1, r.stdout[-3000:] + r.stderr[-2000:])
                self.assertGreaterEqual(report["sentinel"]["step"], 50, about)
                if not report["sentinel"]["came_back"]:
                    continue  # the race did not fire again at that step when recorded in full
                fd = report["first_divergence"]
                self.assertEqual(fd["op"], "aten::_index_put_impl_", about)
                self.assertEqual(fd["class"], "nondeterministic-op", about)
                self.assertGreaterEqual(fd["step"], 50, about)
                self.assertTrue(report["spread"]["parameters_diverged"], about)
                return
            self.fail(f"the race did not part the parameters and come back in {ATTEMPTS} pairs")
        finally:
            remove_dir(tmp)


if __name__ == "__main__":
    unittest.main()
