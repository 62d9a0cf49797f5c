"""CUDA graphs (programs/cuda_graph_train.py): a training step captured whole and replayed, and
torch.compile's mode="reduce-overhead". Recorded, the program's capture must stay intact (no
synchronizing call, no digest kernel captured into its graph), the losses and parameters must be
the plain run's bit for bit, two recorded runs must be identical, and the bytes each replay
rewrote must be digested anew every step, never taken from the step before."""
import re
import subprocess

import pytest

import gpulib

PROGRAM = gpulib.program("cuda_graph_train.py")
STEPS = 4


def has_triton():
    r = subprocess.run([gpulib.PYTHON, "-c", "import triton"], capture_output=True)
    return r.returncode == 0



def step_lines(text):
    return re.findall(r"^step \d+ loss \S+ params \S+$", text, flags=re.M)


@pytest.mark.parametrize("variant", [["--mode", "graph"],
                                     ["--mode", "graph", "--capture-on-current-stream"],
                                     ["--mode", "compile"]],
                         ids=["graph", "graph-on-current-stream", "reduce-overhead"])
def test_captured_steps_record_and_replay_unchanged(variant, gpu):
    if variant[1] == "compile" and not has_triton():
        pytest.skip("torch.compile needs triton, not importable by " + gpulib.PYTHON)
    argv = [gpulib.PYTHON, PROGRAM, "--steps", str(STEPS), *variant]
    plain = gpulib.run_plain(argv)
    assert plain.returncode == 0, f"plain: {plain.stderr[-3000:]}"
    want = step_lines(plain.stdout)
    assert len(want) == STEPS, plain.stdout[-3000:]
    with gpulib.TempDir() as tmp:
        proc, report = gpulib.record_pair(tmp, argv, flags=["--digest", "device"])
        assert report is not None and proc.returncode == 0 and report["verdict"] == "identical", \
            gpulib.describe(proc, report)
        for run in ("run-0", "run-1"):
            got = step_lines(gpulib.output_log(f"{tmp}/{run}"))
            assert got == want, f"{run} printed {got}, the plain run {want}"
        status = gpulib.device_digest_status(f"{tmp}/run-0")
        print(status)
        if "--capture-on-current-stream" in variant:
            # The batch open on the capturing stream was given up, not launched into the graph.
            assert "began capturing a CUDA graph" in status, status
        if variant[1] != "graph":
            return
        # The loss each replay wrote, read by the clone after it: a digest per step, all different
        # (the losses are), none "not read".
        ops = gpulib.export_ops(f"{tmp}/run-0")
        clones = [op for op in ops if op["name"] == "aten::clone"
                  and any(t.get("device", "").startswith("cuda") and t.get("shape") == []
                          for t in gpulib.tensors(op["inputs"]))]
        digests = [gpulib.tensors(op["inputs"])[0].get("digest") for op in clones]
        assert len(digests) == STEPS and all(digests), f"the loss reads after each replay: {digests}"
        assert len(set(digests)) == STEPS, (
            f"the loss a replay wrote was recorded with the same digest on different steps: "
            f"{digests} (an earlier step's description was reused)")
