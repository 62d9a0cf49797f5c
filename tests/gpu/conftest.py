"""The GPU tests skip, each with its reason, where DETAUDIT_PYTHON's torch sees no CUDA device.

Collection never needs a GPU, torch or a build: the probe runs only when a test is set up, in a
subprocess of the Python that the recorded programs use (not necessarily pytest's own).
"""
import functools
import os
import subprocess

import pytest

import gpulib

_PROBE = r"""
import json, torch
info = {"torch": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available()}
if info["available"]:
    p = torch.cuda.get_device_properties(0)
    info.update(name=p.name, capability=f"{p.major}.{p.minor}", sms=p.multi_processor_count)
try:
    import torchvision
    info["torchvision"] = torchvision.__version__
except Exception as e:  # torchvision absent, or built for another torch
    info["torchvision_error"] = f"{type(e).__name__}: {e}"
print(json.dumps(info))
"""


@functools.lru_cache(maxsize=None)
def probe():
    """(info dict or None, reason) for gpulib.PYTHON's torch."""
    try:
        r = subprocess.run([gpulib.PYTHON, "-c", _PROBE], capture_output=True, text=True,
                           timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"cannot run {gpulib.PYTHON}: {e}"
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["?"])[-1]
        return None, f"{gpulib.PYTHON} cannot import torch ({tail})"
    import json
    info = json.loads(r.stdout.strip().splitlines()[-1])
    if not info["available"]:
        return info, (f"no GPU: torch.cuda.is_available() is False for torch {info['torch']} "
                      f"(CUDA {info['cuda']}) at {gpulib.PYTHON}")
    return info, ""


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA device (tests/gpu/, every test)")
    config.addinivalue_line("markers", "timing: measures time; run.sh --jobs runs these alone, "
                                       "before the others run side by side")


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is None:
        return
    info, reason = probe()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def gpu():
    """The device and torch under test (a dict). With a GPU, the CLI must have been built: a
    missing binary is a failure, not a skip (run.sh builds it)."""
    info, reason = probe()
    if reason:
        pytest.skip(reason)
    if not os.access(gpulib.BIN, os.X_OK):
        pytest.fail(f"no detaudit CLI at {gpulib.BIN}: build it (bash tests/gpu/run.sh) or set "
                    "DETAUDIT_BIN", pytrace=False)
    return info
