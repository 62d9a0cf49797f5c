"""Records held until their tensors' digests are in, with everything the thread writes after them.

- The device digest, driven on the CPU: with DETAUDIT_DEVICE_QUEUE=host, CPU tensors go through
  the same pipeline as CUDA tensors on a GPU (a batch per op's inputs and per op's outputs, a
  ring, a collector thread), with a host queue that digests a batch when it is enqueued and
  completes it late.
- MD5 of CPU tensors of up to 4 MiB, copied into a batch on the op's thread and hashed in vector
  lanes, on torch's intra-op threads or on the digest thread (the default digest;
  DETAUDIT_MD5_BATCH=off hashes each tensor alone, =digest-thread runs every batch there).

The trace must be byte for byte what the direct path writes; forked DataLoader workers, extra
threads and a SIGTERM while digests are pending must leave whole records in program order.

    cd tests/e2e && ../../.venv/bin/python -m unittest -v test_held_records
"""
import os
import re
import signal
import unittest

from detaudit_testlib import (PYTHON, example, export_records, in_parallel, make_temp_dir, ops, program,
                              record, remove_dir, run_detaudit, signal_mid_run, tensors)

HELD = {"DETAUDIT_DEVICE_QUEUE": "host"}
# As CudaQueue's fused kernel takes them: strided views read in place, one CUDA call a launch.
HELD_FUSED = dict(HELD, DETAUDIT_DEVICE_KERNEL="fused")
SERIAL_MD5 = {"DETAUDIT_MD5_BATCH": "off"}
MD5_ON_DIGEST_THREAD = {"DETAUDIT_MD5_BATCH": "digest-thread"}
SGD = [PYTHON, example("train_sgd.py"), "--steps", "3"]
SGD_8 = [PYTHON, example("train_sgd.py"), "--steps", "8"]
HAZARDS = [PYTHON, program("batch_hazards.py"), "--steps", "3"]


def cpu_has_md5_lanes():
    """Md5Lanes runs on AVX-512F or AVX2; elsewhere every tensor is hashed alone."""
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    return " avx2" in flags or " avx512f" in flags


def comparable(records):
    """Every record, but what differs between any two runs: the stream header's pid and clock,
    torch's generator state at step 0 (the program seeds it after its first op), and NumPy's and
    Python's generators, which it never seeds."""
    out = []
    for r in records:
        r = dict(r)
        if r["record"] == "header":
            r.pop("pid", None)
            r.pop("unix_ns", None)
        if r["record"] == "step" and r["step"] == 0:
            r.pop("rng_cpu", None)
        if r["record"] == "step":
            r.pop("rng_numpy", None)
            r.pop("rng_python", None)
        out.append(r)
    return out


def record_all(tmp, jobs):
    """Records each job, {name: (flags, command, env)}, at once; returns {name: record()'s result}."""
    names = list(jobs)
    results = in_parallel([lambda n=n: record(os.path.join(tmp, n), jobs[n][1], flags=jobs[n][0],
                                              env=jobs[n][2]) for n in names])
    return dict(zip(names, results))


def status(run_dir, process="r0.main"):
    with open(os.path.join(run_dir, "streams", process + ".status")) as f:
        return f.read()


def device_digests(run_dir):
    """The .status line "device digests: N launches, T tensors, ..., peak held B bytes; launched
    for: in place 3, step 2; C CUDA calls to launch them": {"launches", "tensors", "failed",
    "peak", "why": {reason: n}, "cuda_calls"}."""
    line = next(l for l in status(run_dir).splitlines() if l.startswith("device digests:"))
    m = re.match(r"device digests: (\d+) launches, (\d+) tensors, \d+ waits for a full ring, "
                 r"(\d+) tensors failed, peak held (\d+) bytes; launched for: ([^;]*)"
                 r"(?:; (\d+) CUDA calls to launch them)?", line)
    assert m, line
    why = {}
    for part in m.group(5).split(", "):
        reason, n = part.rsplit(" ", 1)
        why[reason] = int(n)
    copies = re.search(r"; (\d+) tensors \((\d+) bytes\) copied to the digest's order first", line)
    strided = re.search(r"; (\d+) tensors read in place through their strides", line)
    known = re.search(r"; outputs known from their arguments, not read: (\d+) fills, (\d+) copies",
                      line)
    return {"launches": int(m.group(1)), "tensors": int(m.group(2)), "failed": int(m.group(3)),
            "peak": int(m.group(4)), "why": why, "cuda_calls": int(m.group(6) or 0),
            "copies": int(copies.group(1)) if copies else 0,
            "strided": int(strided.group(1)) if strided else 0,
            "known_fills": int(known.group(1)) if known else 0,
            "known_copies": int(known.group(2)) if known else 0, "line": line}


class HeldRecordsCase(unittest.TestCase):
    """Records JOBS, {name: (flags, command, env)}, at once, and the checks both paths share."""
    JOBS = {}

    @classmethod
    def setUpClass(cls):
        cls.tmp = make_temp_dir()
        cls.runs = record_all(cls.tmp, cls.JOBS)

    @classmethod
    def tearDownClass(cls):
        remove_dir(cls.tmp)

    def same_trace(self, direct_name, held_name):
        """The held run's records, after checking they are the direct run's, but what differs
        between any two runs."""
        (rd, direct), (rh, held) = self.runs[direct_name], self.runs[held_name]
        self.assertEqual(rd.returncode, 0, rd.stderr)
        self.assertEqual(rh.returncode, 0, rh.stderr)
        a, b = export_records(direct), export_records(held)
        self.assertGreater(len(ops(a)), 100)
        self.assertEqual(comparable(a), comparable(b))
        d = run_detaudit(["diff", direct, held])
        self.assertEqual(d.returncode, 0, d.stdout + d.stderr)
        self.assertIn("IDENTICAL", d.stdout)
        return b

    def sigterm_saves_whole_records(self, flags, env, status_line, digest_hex):
        run_dir, code, stderr = signal_mid_run(
            os.path.join(self.tmp, "sigterm"), signal.SIGTERM, ["--spin-threads", "2"],
            flags=flags, env=env, at_step=20)
        self.assertEqual(code, 4, stderr)
        self.assertIn("interrupted by SIGTERM", status(run_dir))
        self.assertIn(status_line, status(run_dir))
        recs, e = export_records(run_dir, check=False)
        self.assertEqual(e.returncode, 0, e.stderr)
        for name in ("r0.main.t-main", "r0.main.t-spin-0", "r0.main.t-spin-1"):
            mine = ops(recs, stream=name)
            self.assertGreater(len(mine), 100, name)
            orders = [o["order"] for o in mine]
            self.assertEqual(len(orders), len(set(orders)), f"{name}: an op written twice")
            # Every tensor of every saved record has its digest: a record is saved only whole.
            for o in mine:
                for t in tensors(o["inputs"] + o["outputs"]):
                    if not t.get("uninitialized") and not t.get("not_read"):
                        self.assertRegex(t.get("digest", ""), rf"^[0-9a-f]{{{digest_hex}}}$", o["name"])


class HeldRecords(HeldRecordsCase):
    JOBS = {
        "direct": (["--digest", "device"], SGD, None),
        "held": (["--digest", "device"], SGD, HELD),
        "held-fused": (["--digest", "device"], SGD, HELD_FUSED),
        "workers": (["--runs", "2", "--digest", "device"],
                    [PYTHON, example("dataloader_workers.py"), "--steps", "3"], HELD),
        "threads": (["--runs", "2", "--digest", "device"], [PYTHON, program("python_threads.py")],
                    HELD),
    }

    def test_held_records_are_the_direct_paths_bytes(self):
        b = self.same_trace("direct", "held")
        held = self.runs["held"][1]
        # The held path really ran: many ops' tensors a launch, through the ring, none failed.
        d = device_digests(held)
        self.assertGreater(d["tensors"], len(ops(b)) // 2, d["line"])
        self.assertLess(d["launches"], len(ops(b)) // 4, d["line"])
        self.assertEqual(d["failed"], 0, d["line"])
        # Linear's transposed weight is not in the digest's order: copied first, and counted.
        self.assertGreater(d["copies"], 0, d["line"])
        self.assertEqual(d["strided"], 0, d["line"])
        self.assertNotIn("device digests:", status(self.runs["direct"][1]))

    def test_the_fused_kernels_strided_reads_give_the_direct_paths_bytes(self):
        self.same_trace("direct", "held-fused")
        d = device_digests(self.runs["held-fused"][1])
        # The transposed weight read through its strides, with no copy, one call a launch.
        self.assertGreater(d["strided"], 0, d["line"])
        self.assertEqual(d["copies"], 0, d["line"])
        self.assertEqual(d["cuda_calls"], d["launches"], d["line"])

    def test_dataloader_workers_with_held_records_are_identical_twice(self):
        r, run0 = self.runs["workers"]
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("IDENTICAL", r.stdout)
        recs = export_records(run0)
        workers = {o["stream"] for o in ops(recs) if re.match(r"r0\.main\.\d+\.", o["stream"])}
        self.assertTrue(workers, sorted({o["stream"] for o in ops(recs)}))
        self.assertIn("device digests:", status(run0))

    def test_sigterm_with_digests_pending_saves_whole_records_in_order(self):
        self.sigterm_saves_whole_records(["--digest", "device"], HELD, "device digests:", 16)

    def test_threads_with_batches_open_are_identical_twice(self):
        r, run0 = self.runs["threads"]
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("IDENTICAL", r.stdout)
        self.assertEqual(device_digests(run0)["failed"], 0)


class BatchesAcrossOps(HeldRecordsCase):
    """One launch for many ops' tensors (record.device_batch_mib): each digest is still of the
    bytes its op produced, whatever wrote them next (batch_hazards.py)."""
    JOBS = {
        "direct": (["--digest", "device"], HAZARDS, None),
        "held": (["--digest", "device"], HAZARDS, HELD),
        "per-op": (["--digest", "device", "--device-batch-mib", "0"], HAZARDS, HELD),
        "fused": (["--digest", "device"], HAZARDS, HELD_FUSED),
        "direct-big": (["--digest", "device"], HAZARDS + ["--big-mb", "1"], None),
        "capped": (["--digest", "device", "--device-batch-mib", "2"], HAZARDS + ["--big-mb", "1"],
                   HELD),
    }

    def test_every_digest_is_of_the_bytes_its_op_produced(self):
        b = self.same_trace("direct", "held")
        d = device_digests(self.runs["held"][1])
        # Launched before each write of what a batch held: in place, through a view, out=, the
        # collective, the enclosing kernel; and at each step's end.
        for reason in ("in place", "collective", "enclosing kernel", "step"):
            self.assertGreater(d["why"].get(reason, 0), 0, d["line"])
        # Fills digested from their value, copies from their source's digest: each step's seven
        # dtypes, zero_, the small sums' nested fill_; copy_ into buf and half, addmm's bias.
        self.assertGreaterEqual(d["known_fills"], 3 * 9, d["line"])
        self.assertGreaterEqual(d["known_copies"], 3 * 3, d["line"])
        self.assertEqual(d["why"].get("op", 0), 0, d["line"])
        self.assertLess(d["launches"], len(ops(b)) // 2, d["line"])
        # What CudaQueue would call: the two kernels and the event, nothing allocated or copied.
        self.assertEqual(d["cuda_calls"], 3 * d["launches"], d["line"])

    def test_the_fused_kernels_batches_record_the_same(self):
        # Views written through and read in place: each still digested as its op left it.
        self.same_trace("direct", "fused")
        d = device_digests(self.runs["fused"][1])
        self.assertGreater(d["strided"], 0, d["line"])
        self.assertGreater(d["known_copies"], 0, d["line"])
        self.assertEqual(d["cuda_calls"], d["launches"], d["line"])

    def test_a_batch_per_op_records_the_same(self):
        self.same_trace("direct", "per-op")
        per_op, held = device_digests(self.runs["per-op"][1]), device_digests(self.runs["held"][1])
        self.assertGreater(per_op["why"].get("op", 0), 0, per_op["line"])
        self.assertGreater(per_op["launches"], 2 * held["launches"], (per_op["line"], held["line"]))

    def test_a_program_holding_more_than_the_cap_is_launched_at_the_cap(self):
        self.same_trace("direct-big", "capped")
        d = device_digests(self.runs["capped"][1])
        self.assertGreater(d["why"].get("bytes", 0), 0, d["line"])
        # At most the cap and the tensor that reached it.
        self.assertLessEqual(d["peak"], (2 << 20) + (1 << 20), d["line"])
        self.assertGreaterEqual(d["peak"], 2 << 20, d["line"])


def md5_batch_line(run_dir, process="r0.main"):
    return next(l for l in status(run_dir, process).splitlines() if l.startswith("md5 batches:"))


def md5_batches(run_dir, process="r0.main"):
    """'md5 batches: R runs, T tensors, D runs on the digest thread, I on the intra-op threads'."""
    m = re.match(r"md5 batches: (\d+) runs, (\d+) tensors, (\d+) runs on the digest thread, "
                 r"(\d+) on the intra-op threads", md5_batch_line(run_dir, process))
    return tuple(int(g) for g in m.groups())


@unittest.skipUnless(cpu_has_md5_lanes(), "no AVX2 or AVX-512F: MD5 is never batched on this CPU")
class Md5Batches(HeldRecordsCase):
    LEAVES = HAZARDS + ["--leaves-mb", "3"]
    JOBS = {
        # Steps enough to fill a batch of 512 tensors before the stream ends.
        "serial": (["--digest", "md5"], SGD_8, SERIAL_MD5),
        "batched": (["--digest", "md5"], SGD_8, None),
        "leaves serial": (["--digest", "md5"], LEAVES, SERIAL_MD5),
        "leaves batched": (["--digest", "md5"], LEAVES, None),
        "leaves on the digest thread": (["--digest", "md5"], LEAVES, MD5_ON_DIGEST_THREAD),
        "workers": (["--runs", "2", "--digest", "md5"],
                    [PYTHON, example("dataloader_workers.py"), "--steps", "3"], None),
        "threads": (["--runs", "2", "--digest", "md5"], [PYTHON, program("python_threads.py")], None),
    }

    def test_batched_records_are_the_serial_paths_bytes(self):
        b = self.same_trace("serial", "batched")
        # The batch really ran, with several tensors a run; the serial path never did.
        runs, hashed, on_digest_thread, on_intra_op_threads = md5_batches(self.runs["batched"][1])
        line = md5_batch_line(self.runs["batched"][1])
        self.assertGreater(hashed, len(ops(b)) // 2, line)
        self.assertGreater(hashed, 4 * runs, line)
        # Batches filled during the run were hashed as it went, beside it or on its threads.
        self.assertGreater(on_digest_thread + on_intra_op_threads, 0, line)
        self.assertNotIn("md5 batches:", status(self.runs["serial"][1]))

    def test_tensors_of_several_leaves_and_their_hazards_are_the_serial_paths_bytes(self):
        # Copied whole, leaf by leaf, before the next op writes them; gathered through strides.
        b = self.same_trace("leaves serial", "leaves batched")
        self.same_trace("leaves serial", "leaves on the digest thread")
        n = 3 * (1 << 20) // 4
        sizes = [t["shape"] for o in ops(b) for t in tensors(o["inputs"] + o["outputs"])]
        self.assertIn([n + 7], sizes)
        self.assertIn([n // 64, 64], sizes)
        _, _, on_digest_thread, on_intra_op_threads = md5_batches(self.runs["leaves batched"][1])
        self.assertGreater(on_digest_thread + on_intra_op_threads, 0,
                           md5_batch_line(self.runs["leaves batched"][1]))
        _, _, on_digest_thread, on_intra_op_threads = md5_batches(
            self.runs["leaves on the digest thread"][1])
        self.assertGreater(on_digest_thread, 0)
        self.assertEqual(on_intra_op_threads, 0)

    def test_a_forked_child_batches_on_the_digest_thread_and_never_hangs(self):
        # The parent ran a parallel region before the fork: a batch run on the intra-op threads
        # in the child would wait forever for threads the fork left behind.
        r, run_dir = record(os.path.join(self.tmp, "forked"), [PYTHON, program("forked_child.py")],
                            flags=["--digest", "md5"], timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        runs, hashed, on_digest_thread, on_intra_op_threads = md5_batches(run_dir, "r0.main.0")
        self.assertGreater(hashed, 1000, md5_batch_line(run_dir, "r0.main.0"))
        self.assertGreater(on_digest_thread, 0, md5_batch_line(run_dir, "r0.main.0"))
        self.assertEqual(on_intra_op_threads, 0, md5_batch_line(run_dir, "r0.main.0"))

    def test_dataloader_workers_and_threads_are_identical_twice(self):
        for name in ("workers", "threads"):
            r, run0 = self.runs[name]
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("IDENTICAL", r.stdout, name)
            self.assertIn("md5 batches:", status(run0), name)
        recs = export_records(self.runs["workers"][1])
        workers = {o["stream"] for o in ops(recs) if re.match(r"r0\.main\.\d+\.", o["stream"])}
        self.assertTrue(workers, sorted({o["stream"] for o in ops(recs)}))

    def test_sigterm_with_digests_in_a_batch_saves_whole_records_in_order(self):
        self.sigterm_saves_whole_records(["--digest", "md5"], None, "md5 batches:", 32)


if __name__ == "__main__":
    unittest.main()
