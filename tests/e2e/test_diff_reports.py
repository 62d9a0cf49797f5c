"""`detaudit diff` on real recorded runs: the report formats on a divergent pair, truncated and
corrupt traces, bad run directories and the exit codes of docs/exit-codes.md. Their subject is
the comparator and its reports, not how a torch is recorded: they run under pip's torch only.

    cd build && ctest -R e2e.test_diff_reports --output-on-failure
"""
import json
import os
import re
import shutil
import unittest
import xml.etree.ElementTree as ET

from detaudit_testlib import (PYTHON, comparator_only, error_lines, example, export_ops,
                              load_report, make_tmpdir, remove_tmpdir, run_detaudit, trace_files)


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))


def truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


@comparator_only
class DiffReports(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = make_tmpdir()
        # An identical pair, recorded by `run --runs 2` (its text report on a pipe).
        cls.same_out = os.path.join(cls.tmp, "sgd")
        cls.same_run = run_detaudit(["run", "--runs", "2", "--out", cls.same_out, "-q", "--",
                                     PYTHON, example("train_sgd.py"), "--steps", "2"])
        cls.same = [os.path.join(cls.same_out, f"run-{i}") for i in (0, 1)]
        # A divergent pair recorded separately, with one environment difference.
        cls.div = []
        for i in (0, 1):
            out = os.path.join(cls.tmp, f"dropout{i}")
            r = run_detaudit(["run", "--runs", "1", "--out", out, "-q",
                              "--env", f"PYTHONHASHSEED={i}", "--",
                              PYTHON, example("unseeded_dropout.py"), "--steps", "2"])
            if r.returncode != 0:
                raise AssertionError(r.stderr)
            cls.div.append(os.path.join(out, "run-0"))

    @classmethod
    def tearDownClass(cls):
        remove_tmpdir(cls.tmp)

    def copy_pair(self, pair, name):
        dst = os.path.join(self.tmp, name)
        shutil.rmtree(dst, ignore_errors=True)
        out = []
        for i, run in enumerate(pair):
            d = os.path.join(dst, f"run-{i}")
            shutil.copytree(run, d)
            out.append(d)
        return out

    def diff(self, a, b, *extra):
        return run_detaudit(["diff", a, b, *extra])

    def diff_json(self, a, b, *extra):
        r = self.diff(a, b, "--format", "json", *extra)
        self.assertTrue(r.stdout.strip(), r.stderr)
        return r, json.loads(r.stdout)

    def assert_one_line_error(self, r, code, *needles):
        self.assertEqual(r.returncode, code, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}")
        lines = error_lines(r.stderr)
        self.assertEqual(len(lines), 1, r.stderr)
        for n in needles:
            self.assertIn(n, lines[0])
        self.assertEqual(r.stdout, "", "no report after an error")
        return lines[0]

    # 7. `run --runs 2` exits 0 on identical runs; its text report is plain on a pipe.
    def test_run_identical_exit_code_and_text(self):
        self.assertEqual(self.same_run.returncode, 0, self.same_run.stderr)
        self.assertRegex(self.same_run.stdout, r"^IDENTICAL \d+ ops compared")
        self.assertNotIn("\x1b", self.same_run.stdout)

    # 6. Formats on a real divergent pair.
    def test_json_report_to_file(self):
        path = os.path.join(self.tmp, "report.json")
        r = self.diff(*self.div, "--format", "json", "--output", path)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("divergent", r.stdout)
        self.assertIn(path, r.stdout)
        rep = load_report(path)
        self.assertEqual(rep["schema"], "detaudit.diff/1")
        self.assertEqual(rep["verdict"], "divergent")
        self.assertEqual(rep["exit_code"], 1)
        fd = rep["first_divergence"]
        for key, kind in (("rank", int), ("step", int), ("phase", str), ("op", str),
                          ("index", int), ("class", str), ("remedy", str), ("chain", list),
                          ("stream", str), ("detail", str)):
            self.assertIsInstance(fd[key], kind, key)
        self.assertEqual(fd["rank"], 0)
        self.assertEqual(fd["class"], "rng-state")
        self.assertEqual(fd["phase"], "forward")
        self.assertTrue(fd["remedy"])
        self.assertIsNotNone(fd["catalog"])
        self.assertTrue(fd["catalog"]["id"])
        self.assertTrue(fd["catalog"]["remedy"])
        # index, step and offset point at the op in run A's trace.
        ops = export_ops(self.div[0], fd["stream"])
        self.assertEqual(ops[fd["index"]]["name"], fd["op"])
        self.assertEqual(ops[fd["index"]]["step"], fd["step"])
        self.assertEqual(ops[fd["index"]]["offset"], fd["offset"]["a"])
        self.assertTrue(ops[fd["index"]]["random"])
        # The one environment difference is listed; volatile keys are not.
        env = {(d["key"], d["a"], d["b"]) for d in rep["environment_differences"]}
        self.assertIn(("env.PYTHONHASHSEED", "0", "1"), env)
        keys = {d["key"] for d in rep["environment_differences"]}
        self.assertFalse(keys & {"pid", "run.pid", "start_time"}, keys)
        # ...and not mistaken for the RNG cause: PYTHONHASHSEED seeds no generator.
        self.assertNotIn("PYTHONHASHSEED", fd["cause"] or "")

    def test_junit(self):
        r = self.diff(*self.div, "--format", "junit")
        self.assertEqual(r.returncode, 1, r.stderr)
        root = ET.fromstring(r.stdout)
        suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
        self.assertEqual(len(suites), 1)
        cases = suites[0].findall("testcase")
        verdict = [c for c in cases if c.get("name") == "verdict"]
        self.assertEqual(len(verdict), 1)
        failure = verdict[0].find("failure")
        self.assertIsNotNone(failure, "a divergent pair fails the verdict case")
        self.assertEqual(failure.get("type"), "rng-state")
        self.assertIn("DIVERGENT", failure.text)
        self.assertGreaterEqual(int(suites[0].get("failures")), 1)
        props = {p.get("name"): p.get("value") for p in suites[0].iter("property")}
        self.assertIn("r0.main env.PYTHONHASHSEED", props)
        # The identical pair: parseable, no failure.
        same = self.diff(*self.same, "--format", "junit")
        self.assertEqual(same.returncode, 0, same.stderr)
        root = ET.fromstring(same.stdout)
        self.assertEqual(list(root.iter("failure")), [])

    def test_markdown_and_text(self):
        _, rep = self.diff_json(*self.div)
        fd = rep["first_divergence"]
        md = self.diff(*self.div, "--format", "markdown")
        self.assertEqual(md.returncode, 1)
        self.assertIn(fd["op"], md.stdout)
        self.assertIn(fd["class"], md.stdout)
        text = self.diff(*self.div)
        self.assertEqual(text.returncode, 1)
        self.assertNotIn("\x1b", text.stdout)
        self.assertTrue(text.stdout.startswith("DIVERGENT"))
        self.assertIn(" > ".join(fd["chain"]), text.stdout)
        self.assertIn(fd["class"], text.stdout)
        out = os.path.join(self.tmp, "report.md")
        r = self.diff(*self.div, "--format", "md", "--output", out)
        self.assertEqual(r.returncode, 1)
        self.assertIn(out, r.stdout)
        with open(out) as f:
            content = f.read()
        self.assertTrue(content.startswith(md.stdout.splitlines()[0]), content[:200])
        self.assertIn(fd["op"], content)
        self.assertIn(fd["class"], content)

    # 5. Truncated runs: compared up to the cut, the report says where, and the gate fails
    #    closed (exit 5) unless --allow-truncated.
    def test_truncated_identical_pair(self):
        for side in (0, 1):
            a, b = self.copy_pair(self.same, f"cut{side}")
            victim = trace_files((a, b)[side])[0]
            size = os.path.getsize(victim)
            cut = size // 2 + 3  # most likely inside a record
            truncate(victim, cut)
            r, rep = self.diff_json(a, b)
            self.assertEqual(r.returncode, 5, r.stderr)  # docs/exit-codes.md
            self.assertEqual(rep["verdict"], "incomplete")
            self.assertEqual(rep["exit_code"], 5)
            self.assertEqual(len(rep["not_compared"]), 1, rep["not_compared"])
            self.assertIn("cut short", rep["not_compared"][0])
            errors = [l for l in r.stderr.splitlines() if l.startswith("detaudit: incomplete:")]
            self.assertEqual(len(errors), 1, r.stderr)
            self.assertIsNotNone(rep["truncated"], "the cut is reported")
            t = rep["truncated"]["streams"]
            self.assertEqual(len(t), 1, t)
            self.assertEqual(t[0]["run"], "ab"[side])
            self.assertEqual(os.path.realpath(t[0]["file"]), os.path.realpath(victim))
            self.assertLessEqual(t[0]["offset"], cut)
            self.assertGreater(t[0]["offset"], cut // 2)
            stream = rep["streams"][0]
            self.assertTrue(stream["truncated"])
            self.assertGreater(t[0]["ops_compared"], 0)
            self.assertLess(t[0]["ops_compared"], max(stream["ops_a"], stream["ops_b"]))
            text = self.diff(a, b)
            self.assertIn("INCOMPLETE", text.stdout.splitlines()[0])
            self.assertIn(f"offset {t[0]['offset']}", text.stdout)
            # Allowed, what both runs have passes; the verdict still does not claim the whole run.
            allowed = self.diff(a, b, "--allow-truncated")
            self.assertEqual(allowed.returncode, 0, allowed.stderr)
            self.assertIn("up to the cut", allowed.stdout.splitlines()[0])

    def test_truncated_before_and_after_the_divergence(self):
        _, rep = self.diff_json(*self.div)
        fd = rep["first_divergence"]
        # Cut run B just before the record of the first divergent op: nothing that was compared
        # differs, and the verdict says where it stopped.
        a, b = self.copy_pair(self.div, "cut_before")
        victim = trace_files(b)[0]
        truncate(victim, fd["offset"]["b"] - 1)
        r, before = self.diff_json(a, b)
        self.assertEqual(before["verdict"], "incomplete", before["first_divergence"])
        self.assertEqual(before["truncated"]["streams"][0]["run"], "b")
        self.assertEqual(r.returncode, 5)
        # Cut well after it: the same first divergence is found.
        a, b = self.copy_pair(self.div, "cut_after")
        victim = trace_files(b)[0]
        truncate(victim, (fd["offset"]["b"] + os.path.getsize(victim)) // 2)
        r, after = self.diff_json(a, b)
        self.assertEqual(r.returncode, 1)
        self.assertEqual(after["verdict"], "divergent")
        for k in ("op", "index", "step", "class"):
            self.assertEqual(after["first_divergence"][k], fd[k], k)
        self.assertIsNotNone(after["truncated"])

    def test_corrupt_byte_is_exit_3_naming_file_and_offset(self):
        a, b = self.copy_pair(self.same, "corrupt")
        victim = trace_files(b)[0]
        # A byte inside a record's body, past its length (a flipped length reads as a file cut
        # short inside a record, which is what a killed writer leaves: exit 5, not 3).
        stream = os.path.basename(victim)[:-len(".dtr")]
        offsets = [o["offset"] for o in export_ops(b, stream)]
        at = offsets[len(offsets) // 2] + 4
        flip_byte(victim, at)
        line = self.assert_one_line_error(self.diff(a, b), 3, victim)
        m = re.search(r"offset (\d+)", line)
        self.assertIsNotNone(m, line)
        self.assertLessEqual(int(m.group(1)), at)
        self.assertGreater(int(m.group(1)), 0)
        # The JSON format too: an error, not a report.
        self.assert_one_line_error(self.diff(a, b, "--format", "json"), 3, victim)

    def test_corrupt_environment_file(self):
        a, b = self.copy_pair(self.same, "corrupt_env")
        env = os.path.join(b, "streams", "r0.main.env.json")
        with open(env, "w") as f:
            f.write("{not json")
        self.assert_one_line_error(self.diff(a, b), 3, env)

    def test_bad_run_directories(self):
        missing = os.path.join(self.tmp, "no-such-run")
        self.assert_one_line_error(self.diff(self.same[0], missing), 3, missing,
                                   "no such run directory")
        self.assert_one_line_error(self.diff(self.tmp, self.same[1]), 3, self.tmp,
                                   "not a run directory")
        plain_file = os.path.join(self.tmp, "file.txt")
        open(plain_file, "w").close()
        self.assert_one_line_error(self.diff(plain_file, self.same[1]), 3, plain_file)
        # A run where the interposer recorded nothing is not "identical".
        empty = os.path.join(self.tmp, "empty-run")
        os.makedirs(os.path.join(empty, "streams"), exist_ok=True)
        with open(os.path.join(empty, "streams", "r0.main.status"), "w") as f:
            f.write("not attached: no libtorch in the process\n")
        self.assert_one_line_error(self.diff(empty, empty), 3, empty, "no trace stream",
                                   "not attached")

    def test_usage_errors_are_exit_2(self):
        r = self.diff(self.same[0], "")
        self.assertIn(r.returncode, (2, 3))
        r = run_detaudit(["diff", self.same[0]])
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("RUN_B", r.stderr)
        self.assert_one_line_error(self.diff(*self.same, "--format", "xml"), 2,
                                   "unknown report format 'xml'")
        self.assert_one_line_error(self.diff(*self.same, "--fail-on", "sometimes"), 2,
                                   "--fail-on")


if __name__ == "__main__":
    unittest.main()
