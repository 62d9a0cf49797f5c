"""`detaudit coverage`: every op type a run ran, its inputs captured in one new run of the program
and replayed by the real replayer, under the real interposer.

- The CPU index_put_(accumulate=True) race, in a pair that agreed (the program's 1 intra-op
  thread): coverage names _index_put_impl_ verified nondeterministic under contention (replayed
  up to 10 times as often there, as the catalog lists it), with its catalog entry;
  `--fail-on nondeterministic` and `run --coverage` fail on it (exit 1).
- Random ops (randn, randint, normal_, random_) replay from their captured generator state:
  deterministic, every replay the recorded bits.
- A deterministic CNN: no op type verified nondeterministic; the gate passes.
- A DDP program over gloo: its collectives unverified, saying why.
- A budget of 1 s: kept to, and what it left out unverified, saying so.
- A replayer killed mid-share: the type it was on is unverified, saying how it died; a new
  replayer replays the rest.

    cd build && ctest -R e2e.*test_coverage --output-on-failure
"""
import os
import subprocess
import time
import unittest

from detaudit_testlib import (BIN, PYTHON, TmpDirCase, example, parse_json_output, program,
                              read_json, record, run_detaudit)

# 1M values, not the example's 4M: the pair runs on 1 thread, and the replays race on 2 at 1M.
INDEX_PUT = [PYTHON, example("nondet_index_put.py"), "--steps", "2", "--threads", "1",
             "--values", str(1 << 20)]
BUDGET_LEFT_OUT = "the time budget ran out before its replays"


def coverage(run, *flags, check=None, out=None):
    """`detaudit coverage RUN` as JSON; OUT (default RUN/../coverage) holds its captures."""
    proc = run_detaudit(["coverage", run, "--format", "json", "--force", "-q", *flags,
                         *(["--out", out] if out else [])], check=check)
    return proc, parse_json_output(proc.stdout) if proc.stdout.strip() else None


def rows(report, op):
    return [r for r in report["op_types"] if r["op"] == op]


class IndexPutRaceInAnAgreeingPair(TmpDirCase):
    """`run --coverage`: the pair, then coverage of run-0 with the gate on (as `coverage
    --replays 20 --fail-on nondeterministic` would, through the same code), in one command."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.out = os.path.join(cls.tmp, "pair")
        cls.proc = run_detaudit(["run", "--runs", "2", "--out", cls.out, "--format", "json",
                                 "-q", "--coverage", "--coverage-budget", "120", "--",
                                 *INDEX_PUT])
        cls.report = read_json(os.path.join(cls.out, "coverage.json"))

    def test_the_pair_agreed(self):
        self.assertEqual(parse_json_output(self.proc.stdout)["verdict"], "identical")

    def test_the_race_is_verified_with_its_catalog_entry_and_the_gate_fails(self):
        # Identical, yet the gate fails: a race that did not fire in these runs.
        self.assertEqual(self.proc.returncode, 1, self.proc.stderr)
        self.assertEqual(self.report["replays"], 20)
        [put] = rows(self.report, "aten::_index_put_impl_")
        self.assertEqual(put["verdict"], "verified-nondeterministic", put)
        self.assertEqual(put["dtype"], "float32")
        self.assertIn("index-put-accumulate-cpu", put["catalog"])
        # 20 replays, or up to 200 while a loaded machine runs its threads in the same order.
        self.assertRegex(put["why"], r"^\d+ distinct outputs in \d+ replays under contention "
                                     r"\(2 threads, a busy core\)")
        by_setting = {s["setting"]: s for s in put["series"]}
        self.assertGreater(by_setting["under contention"]["cores_used"], 0, put["series"])
        self.assertGreater(put["distinct"], 1)
        self.assertEqual(by_setting["as recorded"]["distinct"], 1, put["series"])  # 1 thread
        self.assertEqual(by_setting["under the remedy"]["distinct"], 1, put["series"])
        self.assertEqual(self.report["counts"]["verified_nondeterministic"], 1,
                         [r["op"] for r in self.report["op_types"]
                          if r["verdict"] == "verified-nondeterministic"])
        self.assertIn("the gate fails (exit 1)", self.proc.stderr)

    def test_random_ops_replay_the_recorded_bits_from_their_generator_state(self):
        random = [r for r in self.report["op_types"] if r["random"]]
        names = {r["op"] for r in random}
        self.assertTrue({"aten::randn", "aten::normal_"} <= names, names)
        for r in random:
            self.assertEqual(r["verdict"], "deterministic", r)
            for s in r["series"]:
                self.assertEqual(s["matching_recorded"], s["replays"], (r["op"], s))



class DeterministicPrograms(TmpDirCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # One recording of the CNN for the tests that cover it (each coverage captures anew).
        _, cls.cnn = record(os.path.join(cls.tmp, "cnn"),
                            [PYTHON, example("train_sgd.py"), "--steps", "2"])

    def test_a_cnn_has_no_nondeterministic_op_type_and_passes_the_gate(self):
        run = self.cnn
        html = os.path.join(self.tmp, "cnn.html")
        run_detaudit(["coverage", run, "--replays", "8", "--fail-on", "nondeterministic",
                      "--format", "html", "--output", html, "-q"], check=0)
        with open(html) as f:
            self.assertIn("<svg", f.read())
        proc, report = coverage(run, "--replays", "8", check=0)
        self.assertEqual(report["counts"]["verified_nondeterministic"], 0, report["summary"])
        self.assertGreater(report["counts"]["deterministic"], 20, report["summary"])
        [conv] = [r for r in report["op_types"] if r["op"] == "aten::convolution"][:1]
        self.assertEqual(conv["verdict"], "deterministic", conv)
        self.assertEqual(len(conv["series"]), 3)
        # Every type was captured: nll_loss_backward's undefined weight travels as None.
        self.assertFalse([r for r in report["op_types"] if r["why"].startswith("not captured")],
                         report["summary"])
        [nll] = [r for r in report["op_types"] if r["op"] == "aten::nll_loss_backward"]
        self.assertEqual(nll["verdict"], "deterministic", nll)

    def test_a_ddp_programs_collectives_are_unverified_saying_why(self):
        _, run = record(os.path.join(self.tmp, "ddp"),
                        [PYTHON, program("ddp_train.py"), "--launch", "env", "--world", "2",
                         "--steps", "2"])
        proc, report = coverage(run, "--replays", "4")
        self.assertIn(proc.returncode, (0, 4), proc.stderr)  # 4: torch's own teardown abort
        collectives = [r for r in report["op_types"] if r["op"].startswith("c10d::")]
        self.assertTrue(collectives, [r["op"] for r in report["op_types"]])
        for r in collectives:
            self.assertEqual(r["verdict"], "unverified", r)
            self.assertTrue(r["why"].startswith("a collective:"), r)
        self.assertGreater(report["counts"]["deterministic"], 0, report["summary"])
        self.assertEqual(report["counts"]["verified_nondeterministic"], 0, report["summary"])

    def test_the_budget_is_kept_and_what_it_left_out_is_unverified(self):
        proc, report = coverage(self.cnn, "--replays", "200", "--budget", "1", check=0,
                                out=os.path.join(self.tmp, "budget"))
        self.assertEqual(report["budget_s"], 1)
        # The replayer finishes the series it is in (at most a 30 s grace), starts no other.
        self.assertLess(report["spent_s"], 31, report["summary"])
        left_out = [r for r in report["op_types"] if r["why"] == BUDGET_LEFT_OUT]
        self.assertTrue(left_out, report["summary"])
        self.assertGreater(len(left_out), len(report["op_types"]) // 3, report["summary"])

    def test_a_replayer_that_dies_loses_only_the_type_it_was_on(self):
        _, run = record(os.path.join(self.tmp, "killed"), [*INDEX_PUT[:2], "--steps", "1",
                                                           *INDEX_PUT[4:]])
        out = os.path.join(self.tmp, "killed_coverage")
        # A budget a loaded machine still replays the rest in (15 s replayed nothing under
        # `stress`); 100 replays a type keep the replayer busy when it is killed.
        proc = subprocess.Popen([BIN, "coverage", run, "--format", "json", "--replays", "100",
                                 "--workers", "1", "--budget", "90", "--out", out, "-q"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        lines = os.path.join(out, "replay-0.jsonl")
        deadline = time.time() + 120
        while time.time() < deadline and not (os.path.exists(lines) and
                                              os.path.getsize(lines) > 0):
            time.sleep(0.05)
        # As an op that crashes the replayer would: SIGKILL, mid-share.
        subprocess.run(["pkill", "-KILL", "-f", "detaudit_replay --batch " + out], check=True)
        stdout, stderr = proc.communicate(timeout=300)
        self.assertEqual(proc.returncode, 0, stderr)
        report = parse_json_output(stdout)
        died = [r for r in report["op_types"] if r["why"].startswith("the replayer died on it")]
        self.assertEqual(len(died), 1, report["summary"])
        self.assertEqual(died[0]["why"], "the replayer died on it (SIGKILL)")
        # The rest of its share went to a new replayer (largest first: the types after it have
        # fewer bytes), for what the budget left.
        self.assertFalse([r for r in report["op_types"]
                          if r["why"] == "the replayer gave no result for it"], report["summary"])
        self.assertTrue([r for r in report["op_types"] if r["verdict"] == "deterministic" and
                         r["bytes"] <= died[0]["bytes"] and r is not died[0]], report["summary"])

    def test_bad_input_is_one_line_naming_the_file(self):
        proc = run_detaudit(["coverage", os.path.join(self.tmp, "nowhere")], check=3)
        self.assertRegex(proc.stderr, r"^detaudit: error: .*nowhere: no such run directory")
        # A run `detaudit record` made has no command to run again.
        recorded = os.path.join(self.tmp, "recorded-only")
        os.makedirs(os.path.join(recorded, "streams"), exist_ok=True)
        proc = run_detaudit(["coverage", recorded], check=3)
        self.assertRegex(proc.stderr, r"^detaudit: error: .*recorded-only: recorded without "
                                      r"`detaudit run` \(no run.json\)")
        proc = run_detaudit(["coverage", os.path.join(self.tmp, "nowhere"), "--fail-on", "x"],
                            check=2)
        self.assertIn("--fail-on: expected none or nondeterministic", proc.stderr)


if __name__ == "__main__":
    unittest.main()
