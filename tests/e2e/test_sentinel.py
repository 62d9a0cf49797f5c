"""`detaudit run --sentinel`: long runs recorded at each step's end only (parameters, gradients,
optimizer state, loss); the first divergent step is then recorded in full and diffed to the op.
Real programs under the real interposer: a 160-step loop whose CPU index_put race starts at
step 150, the same loop without it, a difference that never comes back, and DDP over gloo.
From its second step a process whose optimizer and backward are marked (every Python program;
C++ with DETAUDIT_OPTIMIZER and DETAUDIT_BACKWARD) sees no op outside the optimizer: its loss
is the backward mark's, recorded under the name of the op that made it when every op was seen
(while its autograd node is of the same type), else as `detaudit::loss`.
The loops are short: what the sentinel does at step 150 of 160 it does at step 9,000 of 10,000,
and each step costs CI its time, twice a run and once for each full recording.

    cd build && ctest -R e2e.*test_sentinel --output-on-failure
"""
import os
import re
import unittest

from detaudit_testlib import (PYTHON, TmpDirCase, build_binary, export_records, output_log,
                              program, record, record_pair, run_program, sleeping_waits, tensors)

LONG_RUN = [PYTHON, program("long_run.py")]
DDP = [PYTHON, program("ddp_train.py")]
STEPS, RACE_FROM = 160, 150
# The race adds for tens of milliseconds a thread, so it changes the bits in nearly every step
# even on a loaded machine; pairs tried at most, each needing it to fire again in the window.
RACE_ATTEMPTS = 3


def audit_until_the_race_comes_back(test, name, command, attempts=RACE_ATTEMPTS):
    """Sentinel audits of command until one finds a step whose full recording diverges too;
    returns its (proc, report, out)."""
    seen = []
    for attempt in range(attempts):
        out = os.path.join(test.tmp, f"{name}{attempt}")
        proc, report = record_pair(out, command, flags=["--sentinel"])
        sentinel = report["sentinel"]
        if sentinel["divergent"] and sentinel["came_back"]:
            return proc, report, out
        if not sentinel["divergent"]:
            seen.append("no step differed")
        else:
            seen.append(f"step {sentinel['step']} differed: {sentinel['note']}")
    test.fail(f"the index_put race did not fire twice at one step in {attempts} audits: "
              + "; ".join(seen))


def lean_from(run_dir, process="r0.main"):
    """The step from which the process saw no op outside the optimizer, from its .status."""
    with open(os.path.join(run_dir, "streams", process + ".status")) as f:
        m = re.search(r"sentinel: no op seen outside the optimizer from step (\d+)", f.read())
    return int(m.group(1)) if m else None


def op_names_by_step(run_dir):
    by_step = {}
    for r in export_records(run_dir, stream="r0.main.t-main"):
        if r["record"] == "op":
            by_step.setdefault(r["step"], []).append((r["name"], r["phase"], r["depth"]))
    return by_step


class DeterministicLongRun(TmpDirCase):
    @sleeping_waits()
    def test_identical_and_recorded_at_each_steps_end_only(self):
        out = os.path.join(self.tmp, "audit")
        argv = LONG_RUN + ["--steps", str(STEPS)]
        proc, report = record_pair(out, argv, flags=["--sentinel"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))
        self.assertFalse(report["sentinel"]["divergent"], report["sentinel"])
        self.assertFalse(os.path.exists(os.path.join(out, "full")), "nothing to record in full")
        # No changed results: the program printed what it prints alone.
        plain = run_program(argv)
        self.assertEqual(plain.returncode, 0, plain.stderr)
        for i in (0, 1):
            self.assertEqual(output_log(os.path.join(out, f"run-{i}")).strip(),
                             plain.stdout.strip())
        # Each step: the loss, then the optimizer step's one record (its gradients in, its
        # parameters and state out), and nothing else. Step 0
        # shows the optimizer's and the backward's marks; from step 1 on no op is seen outside
        # the optimizer, and the loss is the backward mark's, named after the op that made it.
        self.assertEqual(lean_from(os.path.join(out, "run-0")), 1)
        by_step = op_names_by_step(os.path.join(out, "run-0"))
        self.assertEqual(sorted(by_step), list(range(STEPS)))
        loss = ("aten::cross_entropy_loss", "forward", 0)
        state = ("Optimizer.step#SGD.step", "optimizer", 0)
        for step, seen in by_step.items():
            # torch 1.13's zero_grad zeroes the gradients (and its scope makes a handle with
            # `empty`): optimizer phase too, before the forward.
            self.assertTrue(set(seen) <= {loss, state, ("aten::zero_", "optimizer", 0),
                                          ("aten::empty", "optimizer", 0)}, (step, seen))
            self.assertEqual(seen.count(loss), 1, step)
            self.assertEqual(seen.count(state), 1, step)
        # What the record holds: the 4 gradients, then the 4 parameters SGD wrote, as they are
        # at the step's end (a planted change there is found: LateRace, test_numerics).
        state_records = [r for r in export_records(os.path.join(out, "run-0"),
                                                   stream="r0.main.t-main")
                         if r["record"] == "op" and r["name"] == state[0] and r["step"] == 1]
        self.assertEqual(len(state_records), 1)
        grads, = state_records[0]["inputs"]
        params, = state_records[0]["outputs"]
        self.assertEqual([g["shape"] for g in grads], [p["shape"] for p in params])
        self.assertEqual(len(params), 4, params)
        # The loss is found in every step, and it is the program's: the mark carries the tensor
        # the op made (the program prints it every 100 steps, to 6 places).
        points = {p["step"]: p for p in report["spread"]["loss"]}
        self.assertEqual(sorted(points), list(range(STEPS)))
        printed = dict(re.findall(r"step (\d+) loss ([0-9.]+)", plain.stdout))
        self.assertTrue(printed, plain.stdout)
        for step, value in printed.items():
            self.assertAlmostEqual(points[int(step)]["a"], float(value), places=5)

    @sleeping_waits()
    def test_the_loss_from_its_mark_is_the_loss_from_its_op(self):
        # The same run recorded in full at steps 0-3: each step's loss, from the op that made it,
        # has the bits the sentinel's mark gave (steps 1-3, lean).
        sentinel, sentinel_run = record(os.path.join(self.tmp, "sentinel"),
                                        LONG_RUN + ["--steps", "4"], flags=["--sentinel"])
        full, full_run = record(os.path.join(self.tmp, "full"), LONG_RUN + ["--steps", "4"],
                                flags=["--digest", "xxh3"])
        self.assertEqual((sentinel.returncode, full.returncode), (0, 0), sentinel.stderr)

        def loss_digests(run_dir, name):
            return {r["step"]: tensors(r["outputs"])[0]["digest"]
                    for r in export_records(run_dir, stream="r0.main.t-main")
                    if r["record"] == "op" and r["name"] == name and r["depth"] == 0}
        self.assertEqual(lean_from(sentinel_run), 1)
        marked = loss_digests(sentinel_run, "aten::cross_entropy_loss")
        made = loss_digests(full_run, "aten::cross_entropy_loss")
        self.assertEqual(sorted(marked), [0, 1, 2, 3])
        self.assertEqual(made, marked)


    @sleeping_waits()
    def test_a_steps_state_holds_the_bytes_it_names(self):
        """A step's state record, its tensors hashed across torch's two intra-op threads (MD5
        unbatched here, so that the program can compute the digests itself): each step's record
        holds, in order, the digest and range of each gradient read and each momentum buffer and
        parameter written that the program printed, a 2 MiB tree (hashed leaf by leaf, not
        across threads) among them."""
        r, run_dir = record(os.path.join(self.tmp, "state-digests"),
                            [PYTHON, program("step_state_digests.py"), "--steps", "3"],
                            flags=["--sentinel", "--digest", "md5"],
                            env={"DETAUDIT_MD5_BATCH": "off"})
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(run_dir, "streams", "r0.main.status")) as f:
            self.assertIn("step states: 3 hashed across torch's intra-op threads", f.read())
        printed = {}
        for step, role, digest, low, high in re.findall(
                r"^step (\d+) (read|left) md5 (\w+) min (\S+) max (\S+)$", output_log(run_dir),
                re.M):
            printed.setdefault((int(step), role), []).append((digest, float(low), float(high)))
        states = [rec for rec in export_records(run_dir, stream="r0.main.t-main")
                  if rec["record"] == "op" and rec["name"].startswith("Optimizer.step#")]
        self.assertEqual([rec["step"] for rec in states], [0, 1, 2])
        for rec in states:
            for role, values in (("read", rec["inputs"]), ("left", rec["outputs"])):
                got = [(t["digest"], t["stats"]["min"], t["stats"]["max"])
                       for t in tensors(values)]
                self.assertEqual(got, printed[(rec["step"], role)], f"step {rec['step']} {role}")

    @sleeping_waits()
    def test_a_cpp_program_alike(self):
        # libtorch's SGD with momentum, no Python: its optimizer ops and nll_loss each step.
        # Without a backward mark every op is seen; with one (--mark-backward), from step 1 only
        # the optimizer's, and the loss from the mark.
        for flags, lean_step in (([], None), (["--mark-backward"], 1)):
            out = os.path.join(self.tmp, "cpp" + "".join(flags))
            proc, report = record_pair(out, [build_binary("train_cnn"), "--steps", "4"] + flags,
                                       flags=["--sentinel"])
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))
            lean = lean_from(os.path.join(out, "run-0"))
            self.assertEqual(lean, lean_step, flags)
            by_step = op_names_by_step(os.path.join(out, "run-0"))
            self.assertEqual(sorted(by_step), [0, 1, 2, 3])
            for step, seen in by_step.items():
                self.assertEqual(seen[0], ("aten::nll_loss", "forward", 0), (step, seen))
                self.assertTrue(seen[1:] and all(p == "optimizer" and d == 0
                                                 for _, p, d in seen[1:]), (step, seen))
            self.assertEqual([p["step"] for p in report["spread"]["loss"]], [0, 1, 2, 3])
            # No changed results: the losses it printed are the plain program's.
            plain = run_program([build_binary("train_cnn"), "--steps", "4"] + flags)
            self.assertEqual(output_log(os.path.join(out, "run-0")).strip(), plain.stdout.strip())

    def test_every_op_seen_again_once_a_second_thread_runs_an_optimizer(self):
        # Hogwild in threads: each thread's optimizer window would show the other's ops, and its
        # losses land in either. Lean from step 1 on the main thread; from the second thread's
        # first optimizer mark (step 6), every op is seen again.
        code = ("import threading, torch\n"
                "def train(seed):\n"
                "    torch.manual_seed(seed)\n"
                "    m = torch.nn.Linear(8, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
                "    for _ in range(6):\n"
                "        opt.zero_grad(); m(torch.ones(4, 8)).pow(2).mean().backward(); opt.step()\n"
                "train(0)\n"
                "t = threading.Thread(target=train, args=(1,)); t.start(); t.join()\n")
        proc, run = record(os.path.join(self.tmp, "threads"), [PYTHON, "-c", code],
                           flags=["--sentinel"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(lean_from(run), 1)
        # One of several SLURM tasks, each its own rank, is never lean: its collectives may come
        # after the first step.
        slurm = record(os.path.join(self.tmp, "slurm"), [PYTHON, "-c", code],
                       flags=["--sentinel", "--env", "SLURM_NTASKS=2"])
        self.assertEqual(slurm[0].returncode, 0, slurm[0].stderr)
        self.assertIsNone(lean_from(slurm[1]))
        with open(os.path.join(run, "streams", "r0.main.status")) as f:
            self.assertIn("sentinel: every op seen again from step 6: a second thread entered an "
                          "optimizer mark", f.read())
        # Each step's loss, lean or not, is named after the op that made it.
        names = {(r["step"], r["name"]) for r in export_records(run) if r["record"] == "op"}
        self.assertEqual({s for s, n in names if n == "aten::mean"}, set(range(12)))

    def test_a_cpp_race_from_step_2_is_found_there(self):
        # The race planted from step 2 of a lean C++ loop: the first divergent step is 2 or later
        # (a race may not fire at once), never earlier, and the full window names the op. Its
        # audits are a few seconds each: more of them.
        proc, report, out = audit_until_the_race_comes_back(
            self, "cpp-race", [build_binary("train_cnn"), "--steps", "8", "--threads", "2",
                               "--race-from", "2", "--mark-backward"], 2 * RACE_ATTEMPTS)
        sentinel = report["sentinel"]
        self.assertEqual(lean_from(os.path.join(out, "run-0")), 1)
        # From step 2 the loss is `nll_loss + ...`: another op made it than in step 0 (its
        # autograd node says so), and it is recorded as what it is, the mark's loss.
        losses = {step: seen[0] for step, seen in op_names_by_step(
            os.path.join(out, "run-0")).items()}
        self.assertEqual(losses[1], ("aten::nll_loss", "forward", 0))
        self.assertEqual(losses[3], ("detaudit::loss", "forward", 0))
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertGreaterEqual(sentinel["step"], 2, sentinel)
        self.assertEqual(report["first_divergence"]["op"], "aten::_index_put_impl_",
                         report["first_divergence"])


    @sleeping_waits()
    def test_device_digest_is_one_batch_a_step(self):
        # The GPU's pipeline driven on the CPU (DETAUDIT_DEVICE_QUEUE=host): a step's parameter
        # updates share one launch, made at the step's end. (torch 1.13's zero_grad zeroes the
        # gradients the batch still holds: one launch more before it, each step.)
        out = os.path.join(self.tmp, "device")
        proc, report = record_pair(out, LONG_RUN + ["--steps", "50"],
                                   flags=["--sentinel", "--digest", "device",
                                          "--env", "DETAUDIT_DEVICE_QUEUE=host"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(report["verdict"], "identical", report.get("first_divergence"))
        with open(os.path.join(out, "run-0", "streams", "r0.main.status")) as f:
            status = f.read()
        m = re.search(r"device digests: (\d+) launches, (\d+) tensors", status)
        self.assertIsNotNone(m, status)
        self.assertLessEqual(int(m.group(1)), 2 * 50 + 5, status)
        self.assertRegex(status, r"launched for: .*step 50")


class LateRace(TmpDirCase):
    def test_named_at_its_step_then_at_its_index_put(self):
        proc, report, _ = audit_until_the_race_comes_back(
            self, "audit", LONG_RUN + ["--steps", str(STEPS), "--race-from", str(RACE_FROM)])
        sentinel = report["sentinel"]
        self.assertEqual(proc.returncode, 1, proc.stderr)
        # The race fires in nearly every step from RACE_FROM, maybe not in the first. Never
        # before it: the steps before the race are identical.
        self.assertGreaterEqual(sentinel["step"], RACE_FROM, sentinel)
        self.assertLess(sentinel["step"], STEPS, sentinel)
        k = sentinel["step"]
        # Steps k-1 and k in full; if the race fired earlier in those runs, the window moved.
        lo, hi = (int(x) for x in sentinel["full_steps"].split("-"))
        self.assertEqual(hi - lo, 1)
        self.assertEqual((lo, hi) == (k - 1, k), not sentinel["moved"], sentinel)
        self.assertTrue(os.path.isdir(os.path.join(sentinel["full_runs"], "run-1")))
        # What differed first at step level: the optimizer step's record, from a gradient (the
        # race is in the backward; the loss agrees).
        self.assertIn("Optimizer.step#SGD.step (optimizer)", sentinel["first"])
        self.assertTrue(any(t.startswith("input ") and "float32 [256]" in t
                            for t in sentinel["tensors"]), sentinel["tensors"])
        # Then the op: the report is the full recording's diff.
        first = report["first_divergence"]
        self.assertEqual(first["op"], "aten::_index_put_impl_", first)
        self.assertEqual(first["class"], "nondeterministic-op", first)
        # In the full recording of the window, the race may fire at either step (RACE_FROM on).
        self.assertIn(first["step"], (lo, hi), first)
        self.assertGreaterEqual(first["step"], RACE_FROM, first)
        self.assertEqual(first["catalog"]["id"], "index-put-accumulate-cpu", first)
        self.assertEqual(report["run_a"], os.path.join(sentinel["full_runs"], "run-0"))
        # The spread stays the whole run's: from step k on, nearly every step, none before.
        steps = [p["step"] for p in report["spread"]["per_step"]]
        self.assertEqual(min(steps), k)
        self.assertGreaterEqual(len(steps), (STEPS - k) // 2, steps)


class DifferenceThatDoesNotComeBack(TmpDirCase):
    @sleeping_waits()
    def test_step_level_verdict_with_the_command_to_go_on(self):
        out = os.path.join(self.tmp, "audit")
        counter = os.path.join(self.tmp, "runs.txt")
        proc, report = record_pair(out, LONG_RUN + ["--steps", "60", "--perturb", "2:50",
                                                    "--perturb-count", counter],
                                   flags=["--sentinel"])
        with open(counter) as f:
            self.assertEqual(f.read(), "4", "two sentinel runs, then two full ones")
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertEqual(report["verdict"], "divergent")
        sentinel = report["sentinel"]
        self.assertEqual(sentinel["step"], 50, sentinel)
        self.assertFalse(sentinel["came_back"], sentinel)
        self.assertIn("did not happen again", sentinel["note"])
        self.assertIn("--steps 49-", sentinel["command"])
        self.assertIn("long_run.py", sentinel["command"])
        first = report["first_divergence"]
        self.assertEqual(first["step"], 50, first)
        self.assertEqual(first["class"], "step-level", first)
        self.assertIsNone(first["catalog"], first)
        self.assertEqual(report["run_a"], os.path.join(out, "run-0"))
        self.assertEqual(sentinel["moved"], [])

    @sleeping_waits()
    def test_a_difference_earlier_in_the_full_runs_moves_the_window(self):
        # The sentinel pair parts at 50; the second full run then parts at 40, before the
        # window: the window moves there, and the runs after that agree.
        out = os.path.join(self.tmp, "moved")
        counter = os.path.join(self.tmp, "moved-runs.txt")
        proc, report = record_pair(out, LONG_RUN + ["--steps", "60", "--perturb", "2:50",
                                                    "--perturb", "4:40",
                                                    "--perturb-count", counter],
                                   flags=["--sentinel"])
        with open(counter) as f:
            self.assertEqual(f.read(), "6", "two sentinel runs, then two full ones, twice")
        self.assertEqual(proc.returncode, 1, proc.stderr)
        sentinel = report["sentinel"]
        self.assertEqual(sentinel["step"], 50, sentinel)
        self.assertEqual(len(sentinel["moved"]), 1, sentinel)
        self.assertIn("at step 40", sentinel["moved"][0])
        self.assertEqual(sentinel["full_steps"], "39-40")
        self.assertEqual(sentinel["full_runs"], os.path.join(out, "full-2"))
        self.assertFalse(sentinel["came_back"], sentinel)
        self.assertIn("--steps 39-", sentinel["command"])


class GeneratorDrawnOnceMore(TmpDirCase):
    @sleeping_waits()
    def test_found_by_the_generator_state_then_the_extra_random_op(self):
        # The second run draws once more after step 20's update (the recorder's step 21: a step
        # ends with its optimizer step): no parameter, gradient or loss differs, but step 22
        # starts from another generator state.
        out = os.path.join(self.tmp, "audit")
        counter = os.path.join(self.tmp, "runs.txt")
        proc, report = record_pair(out, LONG_RUN + ["--steps", "40", "--extra-draw", "2:20",
                                                    "--extra-draw", "4:20",
                                                    "--perturb-count", counter],
                                   flags=["--sentinel"])
        self.assertEqual(proc.returncode, 1, proc.stderr)
        sentinel = report["sentinel"]
        self.assertEqual(sentinel["step"], 22, sentinel)
        self.assertIn("cpu generator state of r0.main.t-main first differs at step 22",
                      sentinel["generator"])
        self.assertTrue(sentinel["came_back"], sentinel)
        self.assertEqual(sentinel["full_steps"], "21-22")
        # Recorded in full, run B ran one op more at step 21: the extra draw.
        self.assertEqual(report["verdict"], "divergent")
        structural = report["structural_differences"]["first"][0]
        self.assertEqual(structural["step"], 21, structural)
        self.assertIn("outermost: aten::rand", structural["detail"])


class DdpRaceOnOneRank(TmpDirCase):
    def test_sentinel_then_rank_1s_index_put(self):
        for attempt in range(RACE_ATTEMPTS):
            out = os.path.join(self.tmp, f"race{attempt}")
            proc, report = record_pair(out, DDP + ["--launch", "env", "--steps", "3",
                                                   "--race-rank", "1"], flags=["--sentinel"])
            if report["sentinel"]["came_back"]:
                break
        else:
            self.fail(f"the index_put race did not fire twice in {RACE_ATTEMPTS} audits")
        self.assertEqual(proc.returncode, 1, proc.stderr)
        # The race fires in most steps, not in every one: the first step it changed the bits of.
        sentinel = report["sentinel"]
        self.assertIn(sentinel["step"], (0, 1, 2), sentinel)
        first = report["first_divergence"]
        self.assertEqual(first["rank"], 1, first)
        self.assertEqual(first["op"], "aten::_index_put_impl_", first)
        window = [int(s) for s in sentinel["full_steps"].split("-")]  # "0", or "k-1-k"
        self.assertTrue(window[0] <= first["step"] <= window[-1], (first["step"], sentinel))

    def test_the_sentinel_is_the_replica_check(self):
        # One run: ranks that should hold the same parameters, compared at each step.
        proc, run = record(os.path.join(self.tmp, "one"),
                           DDP + ["--launch", "env", "--steps", "3", "--corrupt-rank", "1",
                                  "--corrupt-step", "1"], flags=["--sentinel"])
        self.assertEqual(proc.returncode, 1, proc.stderr)
        self.assertRegex(proc.stdout + proc.stderr, r"Replicas .*DISAGREE .* at step 2")
        self.assertIn("rank 1's parameter", proc.stdout + proc.stderr)


if __name__ == "__main__":
    unittest.main()
