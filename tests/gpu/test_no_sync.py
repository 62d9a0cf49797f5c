"""Recording with the device digest never synchronizes: with a ~200 ms kernel enqueued, 100
recorded ops are issued while the stream is still busy (programs/no_sync.py), and so is each kind
of op a training step of ResNet-50 or GPT-2 runs (--kinds), one kind behind each long kernel.

The same probe is run twice more, so that the test shows it can tell: without detaudit (the
stream must be busy, or the probe itself is broken), and recorded with MD5, whose copy path
waits for every tensor (the stream must then be idle)."""
import os
import re

import pytest

import gpulib

pytestmark = pytest.mark.timing

PROBE = gpulib.program("no_sync.py")
LINE = re.compile(r"no-sync busy=(True|False) issue_ms=([\d.]+) sleep_ms=([\d.]+) ops=(\d+)")


def parse(text, what):
    m = LINE.search(text)
    assert m, f"{what}: no 'no-sync' line in the program's output:\n{text[-3000:]}"
    return {"busy": m[1] == "True", "issue_ms": float(m[2]), "sleep_ms": float(m[3]),
            "ops": int(m[4])}


def recorded(tmp, digest):
    proc, run_dir = gpulib.record_one(os.path.join(tmp, digest), [gpulib.PYTHON, PROBE],
                                      flags=["--digest", digest])
    assert proc.returncode == 0, f"detaudit run --digest {digest}: {gpulib.describe(proc)}"
    return run_dir, parse(gpulib.output_log(run_dir), f"--digest {digest}")


def test_plain_run_sees_a_busy_stream(gpu):
    r = gpulib.run_plain([gpulib.PYTHON, PROBE])
    assert r.returncode == 0, r.stderr[-3000:]
    res = parse(r.stdout, "plain run")
    print(res)
    assert res["busy"], f"even without detaudit the stream was idle after the ops: {res}"


def test_recorded_ops_leave_the_stream_busy(gpu):
    with gpulib.TempDir() as tmp:
        run_dir, res = recorded(tmp, "device")
        print(res)
        ops = [op for op in gpulib.export_ops(run_dir) if op["name"] == "aten::add"
               and any(t.get("device", "").startswith("cuda") and t.get("digest")
                       for t in gpulib.tensors(op["outputs"]))]
        # The 100 measured ops plus the warm-up's: all recorded, each with a digest.
        assert len(ops) >= res["ops"], f"only {len(ops)} CUDA aten::add ops with a digest"
        assert res["busy"], (
            f"the stream was idle once the host had issued {res['ops']} recorded ops: something "
            f"waited for the GPU (issue {res['issue_ms']:.1f} ms, kernel {res['sleep_ms']:.1f} ms)"
            + (" - or the host took longer than the kernel" if res["issue_ms"] >= res["sleep_ms"]
               else ""))


def test_probe_detects_the_synchronizing_copy_path(gpu):
    # MD5 of a CUDA tensor copies it to the host, which waits for the long kernel: the probe
    # must then report an idle stream, or it could not catch a recorder that synchronizes.
    with gpulib.TempDir() as tmp:
        _, res = recorded(tmp, "md5")
        print(res)
        assert not res["busy"], f"the copy path left the stream busy: the probe sees no sync {res}"


KIND = re.compile(r"^kind (.+) busy=(True|False)$", re.M)


def test_each_kind_of_a_steps_ops_leaves_the_stream_busy(gpu):
    argv = [gpulib.PYTHON, PROBE, "--kinds"]
    plain = gpulib.run_plain(argv)
    assert plain.returncode == 0, plain.stderr[-3000:]
    want = dict(KIND.findall(plain.stdout))
    assert want and all(b == "True" for b in want.values()), \
        f"without detaudit some kind already waited for the GPU (the probe is broken): {want}"
    with gpulib.TempDir() as tmp:
        proc, run_dir = gpulib.record_one(tmp, argv, flags=["--digest", "device"])
        assert proc.returncode == 0, gpulib.describe(proc)
        got = dict(KIND.findall(gpulib.output_log(run_dir)))
        print(got)
        assert got.keys() == want.keys(), got
        waited = [k for k, b in got.items() if b != "True"]
        assert not waited, f"recorded, these waited for the GPU: {waited}"
