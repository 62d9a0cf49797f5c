"""Outputs a CPU digest knows from their op's arguments (a copy's source as the copy read it, a
fill's value whose digest the thread remembers) are not read, and name the same bytes as when
they are read: a recording with DETAUDIT_KNOWN_OUTPUTS=off (every output read) and one without
are IDENTICAL under xxh3 and md5, the second's .status counts at least the fills' and the
copy's bytes known and not read (the first's none), and a fill whose value changes at step 2 is
the first divergence there.

    cd tests/e2e && ../../.venv/bin/python -m unittest -v test_known_outputs
"""
import glob
import json
import os
import re
import unittest

from detaudit_testlib import PYTHON, TmpDirCase, in_parallel, program, record, run_detaudit

STEPS = 4
PLANT_STEP = 2
BUFFER_BYTES = 64 * 512 * 4  # the filled buffer and the transposed copy, each step


class KnownOutputs(TmpDirCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.runs = {}
        calls = []
        for digest in ("xxh3", "md5"):
            for known in ("on", "off"):
                for plant in ((False, True) if (digest, known) == ("xxh3", "on") else (False,)):
                    key = (digest, known, plant)
                    argv = [PYTHON, program("known_outputs.py"), "--steps", str(STEPS)]
                    argv += ["--plant-step", str(PLANT_STEP)] if plant else []
                    env = {"DETAUDIT_KNOWN_OUTPUTS": "off"} if known == "off" else None
                    out = os.path.join(cls.tmp, "-".join(map(str, key)))
                    calls.append(lambda o=out, a=argv, e=env, d=digest:
                                 record(o, a, flags=["--digest", d], env=e))
                    cls.runs[key] = os.path.join(out, "run-0")
        cls.results = dict(zip(cls.runs, (r for r, _ in in_parallel(calls))))

    def recorded(self, key):
        r = self.results[key]
        self.assertEqual(r.returncode, 0, f"{key}: {r.stdout}\n{r.stderr}")
        return self.runs[key]

    def diff(self, a, b):
        r = run_detaudit(["diff", self.recorded(a), self.recorded(b), "--format", "json"])
        return r.returncode, json.loads(r.stdout)

    def known_bytes(self, key):
        """The bytes the .status says were known from their arguments, not read."""
        known = 0
        for path in glob.glob(os.path.join(self.recorded(key), "streams", "*.status")):
            with open(path) as f:
                for m in re.finditer(r"outputs known from their arguments, not read: "
                                     r"\d+ fills, \d+ copies, (\d+) bytes", f.read()):
                    known += int(m.group(1))
        return known

    def test_known_and_read_outputs_are_identical(self):
        for digest in ("xxh3", "md5"):
            with self.subTest(digest=digest):
                code, report = self.diff((digest, "off", False), (digest, "on", False))
                self.assertEqual(code, 0, report.get("first_divergence"))
                self.assertEqual(report["verdict"], "identical")

    def test_known_outputs_are_not_read(self):
        for digest in ("xxh3", "md5"):
            with self.subTest(digest=digest):
                self.assertEqual(self.known_bytes((digest, "off", False)), 0)
                # The transposed copy each step, the fill from the second step on (remembered).
                self.assertGreaterEqual(self.known_bytes((digest, "on", False)),
                                        (2 * STEPS - 1) * BUFFER_BYTES)

    def test_a_fill_of_another_value_is_found_at_its_step(self):
        code, report = self.diff(("xxh3", "on", False), ("xxh3", "on", True))
        self.assertNotEqual(code, 0)
        first = report["first_divergence"]
        self.assertEqual((first["op"], first["step"]), ("aten::fill_", PLANT_STEP), first)


if __name__ == "__main__":
    unittest.main()
