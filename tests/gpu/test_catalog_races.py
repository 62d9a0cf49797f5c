"""One program per CUDA catalog op whose only nondeterminism is that op (programs/race_*.py,
float32, many colliding atomic adds). Recorded twice, the first divergence must be that op,
class nondeterministic-op, with its catalog entry. With use_deterministic_algorithms(True), the
outcome the catalog documents: identical runs where a deterministic implementation exists, else
the op refuses to run ("does not have a deterministic implementation").

A race may leave the bits alone in a given pair, so up to DETAUDIT_GPU_RACE_PAIRS pairs (default
3) are recorded. What the program printed decides whether a pair differed (a checksum of the
op's output or of the gradient it made, per step): a pair whose checksums agree must be reported
identical; a pair whose checksums differ must name the op. If no pair differed, the test fails
saying the race was not reproduced, rather than passing without having checked anything.
"""
import os
import re
import time
from dataclasses import dataclass

import pytest

import gpulib

PAIRS = int(os.environ.get("DETAUDIT_GPU_RACE_PAIRS", "3"))
STEPS = "2"
NO_DETERMINISTIC_IMPL = "does not have a deterministic implementation"


@dataclass
class Case:
    name: str
    script: str
    catalog_id: str
    phase: str
    needs_torchvision: bool = False
    # Its deterministic mode runs code compiled by torch.compile (torchvision's _roi_align).
    compiles: bool = False


CASES = [  # roi_align first: its deterministic mode compiles (the longest test), so it starts first
    Case("roi_align", "race_roi_align.py", "torchvision-roi-align-backward", "backward",
         needs_torchvision=True, compiles=True),
    Case("index_add", "race_index_add.py", "index-add-cuda", "forward"),
    Case("scatter_add", "race_scatter_add.py", "scatter-add-cuda", "forward"),
    Case("interpolate_bilinear", "race_interpolate_bilinear.py",
         "upsample-bilinear2d-backward-cuda", "backward"),
    Case("adaptive_avg_pool2d", "race_adaptive_avg_pool2d.py",
         "adaptive-avg-pool2d-backward-cuda", "backward"),
    Case("grid_sample", "race_grid_sample.py", "grid-sampler-2d-backward-cuda", "backward"),
    Case("embedding_bag_max", "race_embedding_bag_max.py", "embedding-bag-max-backward-cuda",
         "backward"),
]
CHECKSUM = re.compile(r"step (\d+) .* checksum (\w+)")


def checksums(run_dir):
    return dict(gpulib.printed(run_dir, CHECKSUM.pattern))


def first_differing_step(out):
    """The first step whose printed checksum differs between run-0 and run-1, or None."""
    a, b = (checksums(os.path.join(out, f"run-{i}")) for i in (0, 1))
    if not a or a.keys() != b.keys():
        raise AssertionError(f"the program did not print a checksum for every step in both runs "
                             f"({out}):\n{gpulib.output_log(os.path.join(out, 'run-0'))[-3000:]}")
    differing = sorted(int(s) for s in a if a[s] != b[s])
    return differing[0] if differing else None


def command(case, *extra):
    return [gpulib.PYTHON, gpulib.program(case.script), "--steps", STEPS, *extra]


def needs(case, gpu):
    if case.needs_torchvision and "torchvision" not in gpu:
        pytest.skip(f"torchvision does not import: {gpu.get('torchvision_error')}")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_deterministic_mode_outcome(case, gpu):
    needs(case, gpu)
    entry = gpulib.catalog_entry(case.catalog_id)
    has_deterministic = entry["deterministic_alternative"]["exists"]
    if case.compiles:
        # Inductor's first compile of it took over 60 s of the program's own on a 16-core H100
        # host (2026-11-27), in each run: a plain run first fills its cache, shared by the
        # recorded runs, so that they take the recorder's time, not the compiler's.
        started = time.monotonic()
        plain = gpulib.run_plain(command(case, "--deterministic"))
        print(f"{case.name}: plain deterministic run, exit {plain.returncode}, "
              f"{time.monotonic() - started:.0f} s (inductor's cache filled)")
    with gpulib.TempDir() as tmp:
        started = time.monotonic()
        proc, report = gpulib.record_pair(tmp, command(case, "--deterministic"),
                                          flags=["--digest", "device"])
        print(f"{case.name}: two recorded deterministic runs, {time.monotonic() - started:.0f} s")
        log = gpulib.output_log(os.path.join(tmp, "run-0"))
        if has_deterministic:
            assert proc.returncode == 0 and report and report["verdict"] == "identical", (
                f"the catalog says {case.catalog_id} has a deterministic implementation, yet: "
                f"{gpulib.describe(proc, report)}\n--- program\n{log[-2000:]}")
            assert first_differing_step(tmp) is None, "the program's own checksums differ"
        else:
            assert NO_DETERMINISTIC_IMPL in log, (
                f"the catalog says {case.catalog_id} has no deterministic implementation, but the "
                f"program did not fail with '{NO_DETERMINISTIC_IMPL}':\n{log[-3000:]}\n"
                f"{gpulib.describe(proc, report)}")
            assert proc.returncode == 4, f"a failed program is exit 4: {gpulib.describe(proc)}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_race_is_named_at_its_op(case, gpu):
    needs(case, gpu)
    entry = gpulib.catalog_entry(case.catalog_id)
    with gpulib.TempDir() as tmp:
        for attempt in range(PAIRS):
            out = os.path.join(tmp, f"pair-{attempt}")
            proc, report = gpulib.record_pair(out, command(case), flags=["--digest", "device"])
            assert report is not None, f"no report: {gpulib.describe(proc)}"
            step = first_differing_step(out)
            if step is None:
                # The race left the bits alone this time: no false alarm allowed.
                assert report["verdict"] == "identical" and proc.returncode == 0, (
                    f"pair {attempt}: the program's checksums agree, yet "
                    f"{gpulib.describe(proc, report)}")
                continue
            print(f"{case.name}: the race showed at step {step} in pair {attempt + 1}")
            assert proc.returncode == 1 and report["verdict"] == "divergent", \
                gpulib.describe(proc, report)
            fd = report["first_divergence"]
            assert fd["class"] == "nondeterministic-op", gpulib.describe(proc, report)
            ops = set(entry["ops"])
            assert fd["op"] in ops or ops & set(fd["chain"]), (
                f"first divergence at {fd['chain']}, not at {case.catalog_id}'s ops {sorted(ops)}")
            assert fd["catalog"] and fd["catalog"]["id"] == case.catalog_id, fd["catalog"]
            assert fd["step"] == step, f"reported step {fd['step']}, the program's checksums " \
                                       f"first differ at step {step}"
            assert fd["phase"] == case.phase, fd["phase"]
            assert not fd["args_differ"]
            assert not any(t["differs"] for t in fd["inputs"]), fd["inputs"]
            assert any(t["differs"] and (t["a"] or {}).get("device", "").startswith("cuda")
                       for t in fd["outputs"]), fd["outputs"]
            return
        pytest.fail(f"not reproduced: the {case.name} race did not change the program's "
                    f"checksums in {PAIRS} recorded pairs (each reported identical), so the "
                    f"verdict could not be checked; raise DETAUDIT_GPU_RACE_PAIRS or the collisions")
