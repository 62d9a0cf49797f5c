"""The reports to look at: the HTML report of real runs, rendered in headless Chromium and checked
in its screenshot (the verdict banner and the plots drawn, by their colours), and the Perfetto
timeline, checked against the trace-event JSON schema and for slices that nest. Their subject
is the reports, not how a torch is recorded: they run under pip's torch only.

    cd build && ctest -R e2e.*test_html_timeline --output-on-failure
"""
import json
import os
import re
import shutil
import struct
import subprocess
import unittest
import zlib

from detaudit_testlib import (PYTHON, comparator_only, example, make_tmpdir, output_log,
                              program, remove_tmpdir, run_detaudit)

SCHEMA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "trace_event.schema.json")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Colours of src/report/html.cpp's plots.
BAR, LINE, LOSS_B, LOSS_DIFF, BANNER_RED = (
    (0xe4, 0x57, 0x56), (0x4c, 0x78, 0xa8), (0xf5, 0x85, 0x18), (0x54, 0xa2, 0x4b), (0xb7, 0x1c, 0x1c))


def read_png(path):
    """(width, height, rows of (r, g, b) tuples) of an 8-bit RGB or RGBA, non-interlaced PNG."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    pos, idat, width = 8, b"", 0
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            assert depth == 8 and colour in (2, 6) and interlace == 0, (depth, colour, interlace)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        line = raw[y * (stride + 1):(y + 1) * (stride + 1)]
        kind, cur = line[0], bytearray(line[1:])
        for i in range(stride):
            a = cur[i - channels] if i >= channels else 0
            b, c = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                cur[i] = (cur[i] + a) & 255
            elif kind == 2:
                cur[i] = (cur[i] + b) & 255
            elif kind == 3:
                cur[i] = (cur[i] + (a + b) // 2) & 255
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append([tuple(cur[x * channels:x * channels + 3]) for x in range(width)])
        prev = cur
    return width, height, rows


def count_colour(rows, rgb, tolerance=12):
    return sum(1 for row in rows for px in row
               if all(abs(px[k] - rgb[k]) <= tolerance for k in range(3)))


def screenshot(html, png, height=2400):
    if not CHROMIUM:
        raise AssertionError("chromium is not installed: run tests/install_deps.sh chromium "
                             "(tests/run_all.sh does)")
    r = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        f"--window-size=1200,{height}", f"--screenshot={png}",
                        "file://" + os.path.abspath(html)], capture_output=True, text=True,
                       timeout=120)
    if not os.path.exists(png):
        raise AssertionError(f"chromium wrote no screenshot (exit {r.returncode}):\n{r.stderr[-2000:]}")
    return read_png(png)


def validate_schema(path):
    """Validates a trace-event file with Debian's python3-jsonschema."""
    code = ("import json,sys,jsonschema;"
            "jsonschema.validate(json.load(open(sys.argv[1])),json.load(open(sys.argv[2])))")
    r = subprocess.run(["/usr/bin/python3", "-c", code, path, SCHEMA], capture_output=True, text=True)
    if r.returncode != 0:
        raise AssertionError(f"{path} does not match {SCHEMA}:\n{r.stderr[-3000:]}")


@comparator_only
class HtmlAndTimeline(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = make_tmpdir()
        cls.out = os.path.join(cls.tmp, "ranks")
        cls.html = os.path.join(cls.tmp, "report.html")
        cls.proc = run_detaudit(["run", "--runs", "2", "--out", cls.out, "--format", "html",
                                 "--output", cls.html, "-q", "--", PYTHON,
                                 program("two_ranks.py"), "--steps", "6"])

    @classmethod
    def tearDownClass(cls):
        remove_tmpdir(cls.tmp)

    def run_dir(self, i):
        return os.path.join(self.out, f"run-{i}")

    def test_html_report_is_self_contained_and_names_the_divergence(self):
        self.assertEqual(self.proc.returncode, 1, self.proc.stderr)
        with open(self.html) as f:
            text = f.read()
        for outside in ("http://", "https://", "<script", " src=", "@import", "url("):
            self.assertNotIn(outside, text)
        self.assertIn("DIVERGENT", text)
        self.assertIn("aten::bernoulli_", text)
        self.assertIn("rng-state", text)
        self.assertIn("rank 1 (r1.main), step 0", text)
        for plot in ("growth-plot", "loss-plot", "rank-lanes"):
            self.assertIn(f'id="{plot}"', text)

    def test_html_report_draws_its_plots(self):
        _, _, rows = screenshot(self.html, os.path.join(self.tmp, "report.png"))
        # The red banner with the verdict, the divergent-ops bars, the relative-difference line,
        # the two loss lines and their difference: each drawn, not only written.
        self.assertGreater(count_colour(rows[:60], BANNER_RED), 20000)
        self.assertGreater(count_colour(rows, BAR), 5000)
        self.assertGreater(count_colour(rows, LINE), 500)
        self.assertGreater(count_colour(rows, LOSS_B), 300)
        self.assertGreater(count_colour(rows, LOSS_DIFF), 100)
        # The loss plotted is rank 1's, and its runs really differ there.
        loss = [re.findall(r"rank 1 step \d+ loss (\S+)", output_log(self.run_dir(i))) for i in (0, 1)]
        self.assertNotEqual(loss[0], loss[1])

    def test_identical_runs_draw_no_divergence(self):
        html = os.path.join(self.tmp, "same.html")
        r = run_detaudit(["diff", self.run_dir(0), self.run_dir(0), "--format", "html", "-o", html])
        self.assertEqual(r.returncode, 0, r.stderr)
        _, _, rows = screenshot(html, os.path.join(self.tmp, "same.png"), height=900)
        self.assertLess(count_colour(rows, BAR), 50)
        self.assertLess(count_colour(rows, BANNER_RED), 50)
        self.assertGreater(count_colour(rows[:60], (0x2e, 0x7d, 0x32)), 20000)  # green banner

    def test_single_run_risk_report_as_html(self):
        out = os.path.join(self.tmp, "risk")
        html = os.path.join(self.tmp, "risk.html")
        r = run_detaudit(["run", "--runs", "1", "--out", out, "--format", "html", "--output", html,
                          "-q", "--", PYTHON, example("nondet_index_put.py"), "--steps", "2"])
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(html) as f:
            text = f.read()
        self.assertIn("aten::_index_put_impl_", text)
        self.assertIn("index-put-accumulate-cpu", text)
        self.assertNotIn("<script", text)
        _, _, rows = screenshot(html, os.path.join(self.tmp, "risk.png"), height=900)
        self.assertGreater(count_colour(rows, BAR), 1000)

    def check_timeline(self, path):
        validate_schema(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
        names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
                 if e["ph"] == "M" and e["name"] == "thread_name"}
        processes = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
        self.assertIn("r1.main", processes)
        self.assertTrue(any(p.startswith("r0.main") for p in processes), processes)
        self.assertIn("t-main", names.values())
        slices = [e for e in events if e["ph"] == "X"]
        self.assertGreater(len(slices), 100)
        self.assertEqual({e["cat"] for e in slices} - {"forward", "backward", "optimizer", "other"}, set())
        # Per lane, slices nest: each starts after its parent starts and ends before it ends.
        by_lane = {}
        for e in slices:
            by_lane.setdefault((e["pid"], e["tid"]), []).append(e)
        for lane, evs in by_lane.items():
            stack = []
            for e in sorted(evs, key=lambda e: (e["ts"], -e["dur"])):
                while stack and stack[-1] <= e["ts"]:
                    stack.pop()
                end = e["ts"] + e["dur"]
                if stack:
                    self.assertLessEqual(end, stack[-1] + 1e-9, f"{lane}: {e['name']} overlaps its parent")
                stack.append(end)
        return events, slices

    def test_export_perfetto_timeline(self):
        path = os.path.join(self.tmp, "run0.json")
        r = run_detaudit(["export", self.run_dir(0), "--perfetto", path])
        self.assertEqual(r.returncode, 0, r.stderr)
        events, slices = self.check_timeline(path)
        ops = [e for e in slices if e["name"] == "aten::bernoulli_"]
        self.assertEqual(len(ops), 12)  # 6 steps on each of 2 ranks
        self.assertEqual(sorted({e["args"]["step"] for e in ops}), list(range(6)))
        self.assertFalse([e for e in events if e.get("args", {}).get("divergent")])

    def test_diff_perfetto_marks_the_divergence(self):
        path = os.path.join(self.tmp, "diff.json")
        report = os.path.join(self.tmp, "diff-report.json")
        r = run_detaudit(["diff", self.run_dir(0), self.run_dir(1), "--perfetto", path,
                          "--format", "json", "-o", report])
        self.assertEqual(r.returncode, 1, r.stderr)
        with open(report) as f:
            first = json.load(f)["first_divergence"]
        events, slices = self.check_timeline(path)
        marked = [e for e in slices if e["args"].get("divergent")]
        with open(report) as f:
            self.assertEqual(len(marked), json.load(f)["spread"]["divergent_ops"])
        firsts = [e for e in events if e["ph"] == "i" and e["name"].startswith("first divergence")]
        self.assertEqual(len(firsts), 1)
        self.assertIn(first["op"], firsts[0]["name"])
        at = [e for e in marked if e["ts"] == firsts[0]["ts"] and e["pid"] == firsts[0]["pid"]]
        self.assertEqual([e["name"] for e in at], [first["op"]])
        self.assertEqual(at[0]["args"]["order"], first["order"]["a"])


if __name__ == "__main__":
    unittest.main()
