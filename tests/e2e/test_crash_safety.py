"""Traces survive the program's death: a target killed with SIGKILL mid-run, one that aborts and
one that raises leave streams that read cleanly up to their last whole record; a corrupted byte is
a one-line error naming file and offset (exit 3) from show, export and diff; a file cut
mid-record reads up to the cut, with a message. A subprocess whose exec fails leaves the
program's trace whole, and a thread that ends as its process leaves through os._exit keeps its
END. A SIGTERM that lands while a thread records an op loses none of the steps it finished.

    cd tests/e2e && ../../.venv/bin/python -m unittest -v test_crash_safety
"""
import json
import os
import re
import shutil
import signal
import unittest

from detaudit_testlib import (PYTHON, example, export_records, in_parallel, make_temp_dir,
                              ops, program, read_json, record, remove_dir, run_detaudit, signal_mid_run,
                              steps)

CRASH_AT = 2
ENDER_DELAYS_US = (0, 0, 0, 50, 50, 100)
ENDER_TENSORS = 100
STOPPED_CHILDREN = 24
TRACE = os.path.join("streams", "r0.main.t-main.dtr")


class CrashSafety(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = make_temp_dir()
        cls.jobs = {
            "abort": [PYTHON, example("crash.py"), "--crash-at", str(CRASH_AT), "--mode", "abort"],
            "raise": [PYTHON, example("crash.py"), "--crash-at", str(CRASH_AT), "--mode", "raise"],
        }
        # Before the fix, about half of these lost the thread's stream.
        for i, delay_us in enumerate(ENDER_DELAYS_US):
            cls.jobs[f"ender-{i}"] = [PYTHON, program("thread_ends_at_exit.py"),
                                      "--delay-us", str(delay_us), "--tensors", str(ENDER_TENSORS)]
        # Before the fix, 2 to 6 of 24 lost the steps they had printed.
        cls.jobs["stopped"] = [PYTHON, program("stopped_mid_record.py"),
                               "--children", str(STOPPED_CHILDREN)]
        names = list(cls.jobs)
        results = in_parallel([lambda n=n: record(os.path.join(cls.tmp, n), cls.jobs[n])
                               for n in names])
        cls.runs = dict(zip(names, results))

    @classmethod
    def tearDownClass(cls):
        remove_dir(cls.tmp)

    def assert_one_line_error(self, r, code, *needles, prefix="detaudit: error:"):
        self.assertEqual(r.returncode, code, r.stdout[-2000:] + r.stderr)
        lines = [l for l in r.stderr.splitlines() if l.startswith(prefix)]
        self.assertEqual(len(lines), 1, r.stderr)
        for n in needles:
            self.assertIn(n, lines[0])
        return lines[0]

    def copy_run(self, name, to):
        dst = os.path.join(self.tmp, to)
        shutil.copytree(self.runs[name][1], dst)
        return dst

    # --- the program dies --------------------------------------------------------------------

    def check_failed_run(self, name, ending):
        r, run_dir = self.runs[name]
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn(f"run-0 failed ({ending})", r.stderr)
        self.assertIn("what it recorded is kept", r.stderr)
        self.assertTrue(os.path.isfile(os.path.join(run_dir, TRACE)))
        run = read_json(os.path.join(run_dir, "run.json"))
        self.assertFalse(run["succeeded"])
        self.assertTrue(run["finished"])
        s = run_detaudit(["show", run_dir])
        self.assertEqual(s.returncode, 0, s.stderr)
        self.assertIn(ending, s.stdout)
        self.assertIn("r0.main.t-main", s.stdout)
        recs, e = export_records(run_dir, check=False)
        self.assertEqual(e.returncode, 0, e.stderr)
        self.assertNotIn("detaudit: error", e.stderr)
        return run, recs

    def test_exception_is_a_failed_run_with_a_complete_trace(self):
        run, recs = self.check_failed_run("raise", "exit code 1")
        self.assertEqual(run["exit_code"], 1)
        self.assertEqual(recs[-1]["record"], "end")
        self.check_ops_up_to_the_crash(recs)

    def test_abort_is_a_failed_run_with_ops_up_to_the_crash(self):
        run, recs = self.check_failed_run("abort", "killed by SIGABRT")
        self.assertEqual(run["signal"], "SIGABRT")
        self.check_ops_up_to_the_crash(recs)
        # The same ops as the run that raised at the same point: nothing before the crash lost.
        _, raised = self.check_failed_run("raise", "exit code 1")
        self.assertEqual([o["name"] for o in ops(recs)], [o["name"] for o in ops(raised)])
        self.assertEqual([(o["order"], o["step"]) for o in ops(recs)],
                         [(o["order"], o["step"]) for o in ops(raised)])

    def check_ops_up_to_the_crash(self, recs):
        # crash.py trains CRASH_AT whole steps, then dies before the next forward pass.
        self.assertEqual(len(ops(recs, "NllLossBackward0")), CRASH_AT)
        self.assertEqual(len(ops(recs, "aten::addmm")), CRASH_AT)
        for k in range(CRASH_AT):
            updates = [o for o in ops(recs, "aten::add_", phase="optimizer") if o["step"] == k]
            self.assertEqual(len(updates), 2, k)  # Linear weight and bias
        # Its last op (written last: nested ops come first) reads the loss for the print.
        self.assertEqual(ops(recs)[-1]["name"], "aten::item")  # the print of the last loss

    def kill_mid_run(self, name, sig, *args):
        """Records train_forever.py ARGS until step 30, then sends SIG to it; returns (run dir,
        detaudit's exit code, its stderr)."""
        return signal_mid_run(os.path.join(self.tmp, name), sig, args)

    def test_sigkill_mid_run_leaves_a_readable_trace(self):
        run_dir, code, stderr = self.kill_mid_run("killed", signal.SIGKILL)
        self.assertEqual(code, 4, stderr)
        self.assertIn("killed by SIGKILL", stderr)

        s = run_detaudit(["show", run_dir, "--json"])
        self.assertEqual(s.returncode, 0, s.stderr)
        summary = json.loads(s.stdout)
        self.assertEqual(summary["ending"], "killed by SIGKILL")
        stream = [x for x in summary["streams"] if x["name"] == "r0.main.t-main"][0]
        self.assertFalse(stream["complete"])
        self.assertGreaterEqual(stream["steps"], 20)
        text = run_detaudit(["show", run_dir])
        self.assertEqual(text.returncode, 0, text.stderr)
        self.assertIn("cut short", text.stdout)

        recs, e = export_records(run_dir, check=False)
        self.assertEqual(e.returncode, 0, e.stderr)
        self.assertNotIn("detaudit: error", e.stderr)
        self.assertRegex(e.stderr, r"r0\.main\.t-main: (cut short|no END record)")
        self.assertNotEqual(recs[-1]["record"], "end")
        self.assertEqual(len(ops(recs)), stream["ops"])
        self.assertEqual(len(steps(recs)), stream["steps"])
        # Whole steps up to the last one: each has its forward, backward and optimizer ops.
        last = max(o["step"] for o in ops(recs))
        for k in range(last):
            phases = {o["phase"] for o in ops(recs) if o["step"] == k}
            self.assertEqual(phases, {"forward", "backward", "optimizer"}, k)
        # The killed run diffs against itself up to the cut, but its tail was never recorded:
        # the gate fails closed (exit 5) and says what was not compared, unless allowed.
        d = run_detaudit(["diff", run_dir, run_dir])
        self.assertEqual(d.returncode, 5, d.stdout + d.stderr)
        self.assertIn("INCOMPLETE", d.stdout)
        line = self.assert_one_line_error(d, 5, "r0.main.t-main", "no END record", prefix="detaudit: incomplete:")
        self.assertIn("--allow-truncated", line)
        d = run_detaudit(["diff", run_dir, run_dir, "--allow-truncated"])
        self.assertEqual(d.returncode, 0, d.stdout + d.stderr)

    def test_sigterm_saves_every_threads_records(self):
        run_dir, code, stderr = self.kill_mid_run("terminated", signal.SIGTERM,
                                                 "--spin-threads", "2")
        self.assertEqual(code, 4, stderr)
        self.assertIn("SIGTERM", stderr)
        with open(os.path.join(run_dir, "streams", "r0.main.status")) as f:
            self.assertIn("interrupted by SIGTERM", f.read())
        recs, e = export_records(run_dir, check=False)
        self.assertEqual(e.returncode, 0, e.stderr)
        streams = {"r0.main.t-main", "r0.main.t-spin-0", "r0.main.t-spin-1"}
        for name in streams:
            mine = ops(recs, stream=name)
            # Each thread's records up to its last whole one: far more than the first 256 KiB
            # or 50 ms the writer would have had without the handler.
            self.assertGreater(len(mine), 200, name)
            self.assertFalse([r for r in recs if r.get("stream") == name and r["record"] == "end"])
        main_steps = {o["step"] for o in ops(recs, stream="r0.main.t-main")}
        self.assertGreaterEqual(max(main_steps), 30)
        d = run_detaudit(["diff", run_dir, run_dir])
        self.assertEqual(d.returncode, 5, d.stdout + d.stderr)

    def test_a_sigterm_mid_record_keeps_every_step_the_program_finished(self):
        """SIGTERM to the main thread at 24 points of a step (one forked child each), as a CI
        runner or a scheduler stops a job: every step a child printed as done is in its trace,
        all its ops. It used to lose the steps whose records waited in the MD5 batch when the
        signal came while the thread was inside its buffer."""
        r, run_dir = self.runs["stopped"]
        with open(os.path.join(run_dir, "output.log")) as f:
            printed = f.read()
        done = {int(i): int(s) for i, s in re.findall(r"^child (\d+) step (\d+)$", printed, re.M)}
        ended = dict(re.findall(r"^child (\d+) ended (\d+)$", printed, re.M))
        self.assertEqual(sorted(done), list(range(STOPPED_CHILDREN)), printed[-2000:])
        # Killed by its SIGTERM (wait status 15), the save done, every one of them.
        self.assertEqual(set(ended.values()), {str(signal.SIGTERM.value)}, ended)
        recs, e = export_records(run_dir, check=False)
        self.assertEqual(e.returncode, 0, e.stderr)
        for i, last in sorted(done.items()):
            stream = f"r0.main.{i}.t-main"
            per_step = {}
            for o in ops(recs, stream=stream):
                per_step[o["step"]] = per_step.get(o["step"], 0) + 1
            self.assertGreater(per_step.get(1, 0), 50, f"{stream}: {per_step}")
            # Steps 1 on run the same ops; the last one printed, all of them.
            self.assertEqual([per_step.get(s, 0) for s in range(1, last + 1)],
                             [per_step[1]] * last, f"child {i} printed step {last}: {per_step}")
            with open(os.path.join(run_dir, "streams", f"r0.main.{i}.status")) as f:
                self.assertIn("ended: interrupted by SIGTERM | thread main |", f.read(), stream)

    def test_a_sigterm_to_a_thread_that_runs_no_more_ops_still_ends_the_program(self):
        """A stop signal waits for its thread's next record; one that never comes (the program
        waits for data, or in a collective) has the signal raised again after its bound, and the
        program ends of it with every step saved."""
        run_dir, code, stderr = signal_mid_run(os.path.join(self.tmp, "waiting"), signal.SIGTERM,
                                               ["--steps", "5", "--then-wait"], at_step=4)
        self.assertEqual(code, 4, stderr)
        with open(os.path.join(run_dir, "streams", "r0.main.status")) as f:
            self.assertIn("ended: interrupted by SIGTERM | thread main | after its last recorded op",
                          f.read())
        recs, e = export_records(run_dir, check=False)
        self.assertEqual(e.returncode, 0, e.stderr)
        for k in range(5):
            phases = {o["phase"] for o in ops(recs) if o["step"] == k}
            self.assertEqual(phases, {"forward", "backward", "optimizer"}, k)
        self.assertEqual(ops(recs)[-1]["name"], "aten::item")  # step 4's print, the last op

    def test_a_thread_ending_as_the_process_exits_keeps_its_stream(self):
        """A thread whose end (its MD5 batch run, its END) overlaps the process's os._exit, as a
        DataLoader worker's queue feeder thread does: the exit waits for that END (it used to
        leave the stream at its header: "no END record", exit 5 from the diff)."""
        for i, delay_us in enumerate(ENDER_DELAYS_US):
            r, run_dir = self.runs[f"ender-{i}"]
            about = f"ender-{i}, os._exit {delay_us} us after the join"
            self.assertEqual(r.returncode, 0, f"{about}: {r.stderr}")
            recs = export_records(run_dir)
            ender = [x for x in recs if x.get("stream") == "r0.main.t-ender"]
            self.assertEqual(len(ops(ender, "aten::add")), ENDER_TENSORS, about)
            self.assertEqual(ender[-1]["record"], "end", about)
            for name in {x["stream"] for x in recs if "stream" in x}:
                last = [x for x in recs if x.get("stream") == name][-1]
                self.assertEqual(last["record"], "end", f"{about}: {name}")

    # --- a damaged trace ---------------------------------------------------------------------

    def middle_op(self, run_dir):
        recs = export_records(run_dir)
        main = ops(recs, stream="r0.main.t-main")
        self.assertGreater(len(main), 10)
        return main, main[len(main) // 2]

    def test_a_failed_exec_in_a_subprocess_leaves_the_trace_whole(self):
        """A vfork child whose exec fails leaves through _exit in the parent's memory: it must
        not flush the parent's streams (it did: a second, undecodable stream, and the ops after
        it gone)."""
        out = os.path.join(self.tmp, "missing_tool")
        r = run_detaudit(["run", "--runs", "2", "--out", out, "-q", "--",
                          PYTHON, program("missing_tool.py"), "--steps", "2"])
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("IDENTICAL", r.stdout)
        for i in (0, 1):
            run_dir = os.path.join(out, f"run-{i}")
            self.assertEqual(sorted(f for f in os.listdir(os.path.join(run_dir, "streams"))
                                    if f.endswith(".dtr")), ["r0.main.t-main.dtr"])
            records = export_records(run_dir)
            self.assertEqual(records[-1]["record"], "end")
            # Both steps' ops, each after its failed exec.
            self.assertEqual({o["step"] for o in ops(records, "aten::tanh")}, {0, 1})

    def test_corrupt_byte_is_exit_3_naming_file_and_offset(self):
        self.assertEqual(self.runs["raise"][0].returncode, 4)
        good = self.runs["raise"][1]
        bad = self.copy_run("raise", "corrupt")
        main, victim = self.middle_op(good)
        path = os.path.join(bad, TRACE)
        with open(path, "r+b") as f:
            f.seek(victim["offset"] + 4)  # inside the record's body: its CRC no longer matches
            byte = f.read(1)
            f.seek(victim["offset"] + 4)
            f.write(bytes([byte[0] ^ 0x5A]))
        offset = str(victim["offset"])
        for args in (["show", bad], ["show", bad, "--step", "0"], ["export", bad],
                     ["diff", good, bad], ["diff", bad, good]):
            r = run_detaudit(args)
            line = self.assert_one_line_error(r, 3, "r0.main.t-main.dtr", "offset")
            self.assertRegex(line, rf"offset {offset}\b", args)
        # export wrote every record before the damaged one.
        recs, _ = export_records(bad, check=False)
        self.assertEqual([o["offset"] for o in ops(recs)],
                         [o["offset"] for o in main if o["offset"] < victim["offset"]])

    def test_truncated_trace_reads_up_to_the_cut(self):
        good = self.runs["raise"][1]
        cut = self.copy_run("raise", "truncated")
        main, victim = self.middle_op(good)
        path = os.path.join(cut, TRACE)
        with open(path, "r+b") as f:
            f.truncate(victim["offset"] + 3)  # mid-record
        before = [o["offset"] for o in main if o["offset"] < victim["offset"]]

        s = run_detaudit(["show", cut])
        self.assertEqual(s.returncode, 0, s.stderr)
        self.assertIn("cut short", s.stdout)
        self.assertIn(str(victim["offset"]), s.stdout)
        j = run_detaudit(["show", cut, "--json"])
        self.assertEqual(j.returncode, 0, j.stderr)
        stream = json.loads(j.stdout)["streams"][0]
        self.assertEqual(stream["ops"], len(before))
        self.assertIn(str(victim["offset"]), stream["cut_short"])

        recs, e = export_records(cut, check=False)
        self.assertEqual(e.returncode, 0, e.stderr)
        self.assertEqual([o["offset"] for o in ops(recs)], before)
        notes = [l for l in e.stderr.splitlines() if "cut short" in l]
        self.assertEqual(len(notes), 1, e.stderr)
        self.assertIn("r0.main.t-main", notes[0])
        self.assertIn(str(victim["offset"]), notes[0])

        d = run_detaudit(["diff", good, cut])
        self.assertEqual(d.returncode, 5, d.stdout + d.stderr)
        self.assertIn("was cut short", d.stdout)
        self.assertIn(str(victim["offset"]), d.stdout)
        # Allowed, the cut leaves what both recorded, alike: a program that failed by itself
        # (an exit status) in both runs, which no run can judge.
        d = run_detaudit(["diff", good, cut, "--allow-truncated"])
        self.assertEqual(d.returncode, 4, d.stdout + d.stderr)
        self.assertTrue(d.stdout.startswith("FAILED"), d.stdout)


if __name__ == "__main__":
    unittest.main()
