#!/usr/bin/env python3
"""The bench's regression row (bench.check_figures): a mode 10% slower than its committed figure
fails, in its median and its fastest repeats alike; anything less, or one slow repeat, passes."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def row(mode, ratio, fastest):
    return {"workload": "gpt2 (python)", "mode": mode, "ratio": ratio, "min_ratio": fastest}


class CheckFigures(unittest.TestCase):
    def setUp(self):
        self.path = os.path.join(tempfile.mkdtemp(), "figures.json")
        with open(self.path, "w") as f:
            json.dump({"ratios": {"gpt2 (python) | xxh3 + stats": 1.40}}, f)

    def test_a_mode_10_percent_slower_in_every_repeat_fails(self):
        failing = bench.check_figures([row("xxh3 + stats", 1.56, 1.55)], self.path, False)
        self.assertEqual(len(failing), 1)
        self.assertIn("xxh3 + stats", failing[0])

    def test_within_10_percent_passes(self):
        self.assertEqual(bench.check_figures([row("xxh3 + stats", 1.53, 1.50)], self.path, False), [])

    def test_a_slow_median_with_a_fast_repeat_passes(self):
        # Another guest's load only adds time: the fastest repeats still meet the figure.
        self.assertEqual(bench.check_figures([row("xxh3 + stats", 1.70, 1.42)], self.path, False), [])

    def test_a_mode_without_a_figure_is_not_judged(self):
        self.assertEqual(bench.check_figures([row("md5 + stats", 9.0, 9.0)], self.path, False), [])

    def test_update_writes_the_ratios_and_then_they_are_the_bar(self):
        bench.check_figures([row("xxh3 + stats", 1.20, 1.18), row("plain", 1.0, 1.0)], self.path, True)
        with open(self.path) as f:
            ratios = json.load(f)["ratios"]
        self.assertEqual(ratios, {"gpt2 (python) | xxh3 + stats": 1.2})
        self.assertEqual(len(bench.check_figures([row("xxh3 + stats", 1.40, 1.39)], self.path, False)), 1)


if __name__ == "__main__":
    unittest.main()
