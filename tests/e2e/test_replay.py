"""`detaudit replay`: the op's inputs captured from a new run of the recorded command, the op called
again and again on them in a fresh process, under the real interposer and the real replayer.

- The CPU index_put_(accumulate=True) race: reproduced (more than one distinct output) on the
  inputs it really had, and use_deterministic_algorithms(True) verified in isolation; the same for
  the C++ program's race, and of rank 1 of a DDP program.
- A deterministic op chosen with --op: every replay identical, and the report says so.
- A program that takes another path on the new run: run again up to --capture-runs (3) times;
  still on another path: said, exit 7, nothing saved.
- `run --verify-remedy`: the race's remedy (deterministic mode) and an unseeded program's
  (--seed) applied by run itself, two more runs recorded and diffed: identical, with the flags.

    cd build && ctest -R e2e.*test_replay --output-on-failure
"""
import os
import subprocess
import unittest

from detaudit_testlib import (PYTHON, TmpDirCase, build_binary, example, export_records,
                              make_tmpdir, parse_json_output, program, read_json, record,
                              record_pair, remove_tmpdir, run_detaudit)

INDEX_PUT = [PYTHON, example("nondet_index_put.py"), "--steps", "2"]
NOT_CAPTURED = 7
# CPU tensors through the device digest's pipeline, as CUDA tensors go on a GPU.
HELD = {"DETAUDIT_DEVICE_QUEUE": "host"}
# Races fire less on a loaded machine: a pair of the race is recorded again while its runs came
# out identical, a race op replayed again while no replay reproduced it; after that, a failure.
PAIR_ATTEMPTS = 3
REPLAY_ATTEMPTS = 3
REPLAYS = 12


def op_index(run, stream, name):
    """The first op named `name` in `stream`, numbered as the reports number ops."""
    ops = [r for r in export_records(run, stream=stream) if r["record"] == "op"]
    return next(i for i, op in enumerate(ops) if op["name"] == name)


# Recordings several tests read, made once on first use: each run of a torch program costs
# seconds of CPU. A `--verify-remedy` pair's run-0 and run-1 are ordinary runs of the command.
_shared = {}


def shared_dir():
    if "tmp" not in _shared:
        _shared["tmp"] = make_tmpdir()
    return _shared["tmp"]


def tearDownModule():
    remove_tmpdir(_shared.get("tmp"))


def race_pairs():
    """[(proc, report, out)] of `run --runs 2 --verify-remedy` of INDEX_PUT, recorded again while
    the race left the pair identical, at most PAIR_ATTEMPTS times; the tests use the last."""
    if "race" not in _shared:
        attempts = []
        for k in range(PAIR_ATTEMPTS):
            out = os.path.join(shared_dir(), f"race{k}")
            proc, report = record_pair(out, INDEX_PUT, flags=["--verify-remedy"])
            attempts.append((proc, report, out))
            if report["verdict"] != "identical":
                break
        _shared["race"] = attempts
    return _shared["race"]


def unseeded_pair():
    """(proc, report, out) of `run --runs 2 --verify-remedy` of the unseeded print_random.py."""
    if "unseeded" not in _shared:
        out = os.path.join(shared_dir(), "unseeded")
        proc, report = record_pair(out, [PYTHON, program("print_random.py")],
                                   flags=["--verify-remedy"])
        _shared["unseeded"] = (proc, report, out)
    return _shared["unseeded"]


class Replay(TmpDirCase):
    def replay(self, run, *args, env=None):
        proc = run_detaudit(["replay", run, "--format", "json", "--replays", str(REPLAYS), *args],
                            env=env)
        return proc, parse_json_output(proc.stdout) if proc.stdout.strip() else None

    def replay_race(self, run, *args, env=None):
        """replay(), again (--force) while no replay reproduced the race, REPLAY_ATTEMPTS at
        most: on a loaded machine a series' threads may happen to run one after the other."""
        for attempt in range(REPLAY_ATTEMPTS):
            proc, report = self.replay(run, *args, *(["--force"] if attempt else []), env=env)
            if not report or report["evidence"] != "not-reproduced":
                break
        return proc, report

    def assert_pair_recorded(self, proc, report):
        # Both runs recorded and diffed: the exit is the verdict's.
        expected = {"identical": 0, "divergent": 1}.get(report["verdict"])
        self.assertEqual(proc.returncode, expected, f"{report['verdict']}: {proc.stderr}")

    def check_race_reproduced(self, proc, report):
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(report["op"]["name"], "aten::_index_put_impl_", report["op"])
        self.assertEqual(report["capture"]["status"], "saved", report["capture"])
        self.assertTrue(report["capture"]["inputs_match"], report["capture"])
        self.assertTrue(os.path.exists(report["capture"]["inputs_file"]))
        self.assertEqual(report["evidence"], "verified-nondeterministic",
                         f"the race did not fire in {REPLAY_ATTEMPTS} replays of {REPLAYS} calls "
                         f"a setting: {report['evidence_line']}")
        self.assertRegex(report["evidence_line"],
                         rf"^reproduced: \d+ distinct outputs in {REPLAYS} replays")
        shown = [s for s in report["series"] if s["distinct"] > 1]
        self.assertTrue(shown and all(not s["deterministic"] for s in shown), report["series"])
        self.assertTrue(all(s["max_abs_diff"] > 0 for s in shown), report["series"])
        remedy = [s for s in report["series"] if s["setting"] == "under the remedy"]
        self.assertEqual(len(remedy), 1, report["series"])
        self.assertTrue(remedy[0]["deterministic"])
        self.assertEqual(remedy[0]["distinct"], 1, remedy)
        self.assertTrue(report["remedy_line"].startswith(
            f"remedy verified in isolation: {REPLAYS} of {REPLAYS}"), report["remedy_line"])

    def test_index_put_race_is_reproduced_and_the_remedy_verified(self):
        proc, report, out = race_pairs()[-1]
        self.assert_pair_recorded(proc, report)
        first = report.get("first_divergence")
        replay_out = os.path.join(out, "replay-race")  # the pair's other tests replay too
        if report["verdict"] == "divergent" and first["op"] == "aten::_index_put_impl_":
            # A race before the first divergence (step 0's, when the two runs happened to agree
            # there) may send a new run down another path: more new runs than the default 3.
            proc, replayed = self.replay_race(out, "--first-divergence", "--capture-runs", "8",
                                              "--out", replay_out)
            self.assertEqual(replayed["op"]["index"], first["index"])
        else:
            # The race did not change the runs this time; the op is still there to replay.
            run = os.path.join(out, "run-0")
            at = op_index(run, "r0.main.t-main", "aten::_index_put_impl_")
            proc, replayed = self.replay_race(out, "--op", f"r0.main.t-main:{at}",
                                              "--out", replay_out)
        self.check_race_reproduced(proc, replayed)
        # The saved inputs are real tensors that torch reads back.
        self.assertEqual(replayed["op"]["stream"], "r0.main.t-main")

    def test_cpp_program_race_is_replayed(self):
        out = os.path.join(self.tmp, "cpp")
        command = [build_binary("train_cnn"), "--race", "--threads", "2", "--steps", "2"]
        proc, run = record(out, command)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        at = op_index(run, "r0.main.t-main", "aten::_index_put_impl_")
        proc, replayed = self.replay_race(run, "--op", f"r0.main.t-main:{at}")
        self.check_race_reproduced(proc, replayed)

    def test_a_ddp_ranks_op_is_replayed(self):
        # ddp_train.py --race-rank 1: only rank 1 runs the race, over 2 gloo ranks.
        out = os.path.join(self.tmp, "ddp")
        proc, run = record(out, [PYTHON, program("ddp_train.py"), "--launch", "env", "--steps", "2",
                                 "--race-rank", "1"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        at = op_index(run, "r1.main.t-main", "aten::_index_put_impl_")
        proc, replayed = self.replay_race(run, "--op", f"r1.main.t-main:{at}")
        self.assertEqual(replayed["op"]["stream"], "r1.main.t-main")
        self.check_race_reproduced(proc, replayed)

    def test_deterministic_op_replays_identical(self):
        proc, report, out = race_pairs()[-1]
        self.assert_pair_recorded(proc, report)
        at = op_index(os.path.join(out, "run-0"), "r0.main.t-main", "aten::sub")
        proc, replayed = self.replay(out, "--op", f"r0.main.t-main:{at}",
                                     "--out", os.path.join(out, "replay-sub"))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(replayed["op"]["name"], "aten::sub")
        self.assertTrue(replayed["capture"]["inputs_match"], replayed["capture"])
        self.assertEqual(replayed["capture"]["runs"], 1, replayed["capture"])
        self.assertEqual(replayed["evidence"], "not-reproduced", replayed)
        self.assertTrue(replayed["evidence_line"].startswith("not reproduced in isolation"))
        for s in replayed["series"]:
            self.assertEqual((s["replays"], s["distinct"], s["max_abs_diff"]), (REPLAYS, 1, 0.0),
                             s)
            # The recorded run's own output came out of every replay.
            self.assertEqual(s["matching_recorded"], REPLAYS, s)

    def test_inputs_keep_their_layout(self):
        # A slice with an offset and gaps, and an input expanded with stride 0: saved and replayed
        # as the op received them, read back by torch.load.
        out = os.path.join(self.tmp, "strided")
        proc, run = record(out, [PYTHON, program("strided_inputs.py")])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        layouts = {"aten::mul": ((5, 4), (8, 2), 8, 6 * 8 * 4),
                   "aten::add_": ((5, 4), (1, 0), 0, 5 * 4)}
        saved = {}
        for name in layouts:
            with self.subTest(op=name):
                at = op_index(run, "r0.main.t-main", name)
                # An --out each: both saved inputs are kept for one torch.load below.
                proc, replayed = self.replay(run, "--op", f"r0.main.t-main:{at}",
                                             "--out", os.path.join(out, "replay-" + name[6:]))
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertTrue(replayed["capture"]["inputs_match"], replayed["capture"])
                for s in replayed["series"]:
                    self.assertEqual((s["distinct"], s["matching_recorded"]), (1, REPLAYS), s)
                saved[name] = replayed["capture"]["inputs_file"]
        self.assertEqual(list(saved), list(layouts))
        # One process reads every saved file back: each import of torch costs seconds of CPU.
        check = subprocess.run(
            [PYTHON, "-c", "import sys, torch\n"
             "for path in sys.argv[1:]:\n"
             "    args = torch.load(path, weights_only=False)\n"
             "    print([(tuple(t.shape), t.stride(), t.storage_offset(), "
             "(t.untyped_storage() if hasattr(t, 'untyped_storage') else t.storage()).nbytes()) "
             "for t in args if isinstance(t, torch.Tensor)])",
             *saved.values()], capture_output=True, text=True)
        self.assertEqual(check.returncode, 0, check.stderr)
        read_back = check.stdout.splitlines()
        self.assertEqual(len(read_back), len(saved), check.stdout)
        for (name, layout), line in zip(layouts.items(), read_back):
            with self.subTest(op=name):
                self.assertIn(str(layout), line)

    def test_another_path_saves_nothing(self):
        # Unseeded: the new run's inputs are other bytes than the recorded ones. With the device
        # digest (CPU tensors through the host queue), the inputs' digests are still on their way
        # when the op is reached.
        for name in ("host", "device"):
            with self.subTest(digest=name):
                if name == "host":
                    # run-0 of VerifyRemedy's unseeded pair: a plain host-digest run.
                    proc, report, pair = unseeded_pair()
                    self.assert_pair_recorded(proc, report)
                    run, env = os.path.join(pair, "run-0"), None
                else:
                    env = HELD
                    proc, run = record(os.path.join(self.tmp, "unseeded-device"),
                                       [PYTHON, program("print_random.py")],
                                       flags=["--digest", "device"], env=env)
                    self.assertEqual(proc.returncode, 0, proc.stderr)
                ops = [r for r in export_records(run, stream="r0.main.t-main")
                       if r["record"] == "op"]
                # The first op that reads a random tensor.
                at = next(i for i, op in enumerate(ops)
                          if not op["random"] and any(isinstance(v, dict) and v.get("digest") and
                                                      not v.get("not_read") for v in op["inputs"]))
                proc, replayed = self.replay(run, "--op", f"r0.main.t-main:{at}", env=env)
                self.assertEqual(proc.returncode, NOT_CAPTURED, proc.stderr)
                self.assertEqual(replayed["capture"]["status"], "other-path", replayed["capture"])
                self.assertIn("differ from the record's", replayed["capture"]["why"])
                # Another path is what an upstream race gives on some runs: tried again, up to
                # --capture-runs (3) new runs, each said.
                self.assertEqual(replayed["capture"]["runs"], 3, replayed["capture"])
                self.assertIn("(run 3 of at most 3)", proc.stderr)
                self.assertEqual(proc.stderr.count("detaudit: not captured (other-path)"), 3,
                                 proc.stderr)
                self.assertIn("(other-path in 3 new runs)", replayed["evidence_line"])
                self.assertEqual(replayed["evidence"], "unverified")
                self.assertEqual(replayed["series"], [])
                self.assertFalse(os.path.exists(os.path.join(run, "replay", "capture",
                                                             "inputs.pt")))

    def test_a_run_on_another_path_is_followed_by_another(self):
        # Recorded on run 0; the first new run takes the other path, the second the recorded one.
        counter = os.path.join(self.tmp, "counter")
        out = os.path.join(self.tmp, "every-other")
        proc, run = record(out, [PYTHON, program("every_other_run.py"), counter])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        at = op_index(run, "r0.main.t-main", "aten::mul")
        proc, replayed = self.replay(run, "--op", f"r0.main.t-main:{at}")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(replayed["capture"]["status"], "saved", replayed["capture"])
        self.assertEqual(replayed["capture"]["runs"], 2, replayed["capture"])
        self.assertTrue(replayed["capture"]["inputs_match"], replayed["capture"])
        self.assertEqual(proc.stderr.count("detaudit: not captured (other-path)"), 1, proc.stderr)
        self.assertEqual(replayed["evidence"], "not-reproduced", replayed)
        # One new run only, on the other path: that is the answer.
        with open(counter, "w") as f:
            f.write("1")
        proc, replayed = self.replay(run, "--op", f"r0.main.t-main:{at}", "--capture-runs", "1",
                                     "--force")
        self.assertEqual(proc.returncode, NOT_CAPTURED, proc.stderr)
        self.assertEqual(replayed["capture"]["runs"], 1, replayed["capture"])
        self.assertEqual(replayed["capture"]["status"], "other-path", replayed["capture"])

    def test_a_device_digest_run_is_replayed(self):
        # The digest a CUDA run records (--digest device), through the host queue: the replayer
        # hashes with the same digest, so the saved inputs compare with the record.
        out = os.path.join(self.tmp, "device")
        proc, run = record(out, INDEX_PUT, flags=["--digest", "device"], env=HELD)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        at = op_index(run, "r0.main.t-main", "aten::_index_put_impl_")
        proc, replayed = self.replay_race(run, "--op", f"r0.main.t-main:{at}", env=HELD)
        self.assertEqual(replayed["capture"]["digest"], "device", replayed["capture"])
        self.check_race_reproduced(proc, replayed)

    def test_an_op_that_is_not_there_is_a_usage_error(self):
        proc, report, out = race_pairs()[-1]
        self.assert_pair_recorded(proc, report)
        proc, _ = self.replay(os.path.join(out, "run-0"), "--op", "r0.main.t-main:999999")
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertIn("there is no op 999999", proc.stderr)


class VerifyRemedy(unittest.TestCase):
    def remedy_of(self, out):
        remedy = os.path.join(out, "remedy.json")
        return read_json(remedy) if os.path.exists(remedy) else None

    def test_the_race_is_identical_in_deterministic_mode(self):
        for proc, report, out in race_pairs():
            if report["verdict"] == "identical":
                self.assertIsNone(self.remedy_of(out), "nothing to verify after an identical "
                                                       "verdict")
        proc, report, out = race_pairs()[-1]
        remedy = self.remedy_of(out)
        self.assertEqual(report["verdict"], "divergent",
                         f"the race did not change the runs in {PAIR_ATTEMPTS} pairs")
        self.assertEqual(proc.returncode, 1, proc.stderr)  # the program as given still diverges
        self.assertEqual(report["first_divergence"]["class"], "nondeterministic-op")
        self.assertTrue(remedy["verified"], remedy)
        self.assertEqual(remedy["flags"], "--deterministic on")
        self.assertEqual([r["verdict"] for r in remedy["rounds"]], ["identical"], remedy)
        self.assertIn("remedy verified: identical with --deterministic on", proc.stderr)
        self.assertEqual(report["remedy_verification"]["flags"], "--deterministic on")

    def test_an_unseeded_program_is_identical_with_a_seed(self):
        proc, report, out = unseeded_pair()
        remedy = self.remedy_of(out)
        self.assertEqual(report["verdict"], "divergent", report)
        self.assertEqual(report["first_divergence"]["class"], "rng-state")
        self.assertTrue(remedy["verified"], remedy)
        self.assertEqual(remedy["flags"], "--seed 0")
        # The report itself carries it.
        verification = report["remedy_verification"]
        self.assertTrue(verification["verified"], verification)
        self.assertEqual(verification["flags"], "--seed 0")
        self.assertEqual([r["verdict"] for r in verification["rounds"]], ["identical"])
        # The runs with the remedy are real runs, recorded where remedy.json says.
        self.assertTrue(os.path.isdir(os.path.join(remedy["rounds"][0]["runs"], "run-1",
                                                   "streams")))


if __name__ == "__main__":
    unittest.main()
