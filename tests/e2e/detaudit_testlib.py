"""Helpers shared by the end-to-end tests: where the build is, running the CLI, reading reports
and exported traces, and temporary directories.

    from detaudit_testlib import run_detaudit, load_report, make_tmpdir, example, PYTHON

The environment gives the paths (ctest sets them, tests/CMakeLists.txt):
DETAUDIT_BIN, DETAUDIT_BUILD_DIR, DETAUDIT_SOURCE_DIR. Without them the paths default to a
`build/` directory beside the sources, so `python3 -m unittest` works from tests/e2e/ too.
"""
import json
import os
import shutil
import subprocess
import tempfile

SOURCE_DIR = os.environ.get(
    "DETAUDIT_SOURCE_DIR",
    os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BUILD_DIR = os.environ.get("DETAUDIT_BUILD_DIR", os.path.join(SOURCE_DIR, "build"))
BIN = os.environ.get("DETAUDIT_BIN", os.path.join(BUILD_DIR, "bin", "detaudit"))
# Debian's torch lives in the system interpreter, not in the pyenv python3 first on PATH.
PYTHON = "/usr/bin/python3"

DEFAULT_TIMEOUT = 300


def example(name):
    """Absolute path of examples/<name>."""
    return os.path.join(SOURCE_DIR, "examples", name)


def build_binary(name):
    """Absolute path of build/bin/<name> (train_cnn, ...)."""
    return os.path.join(BUILD_DIR, "bin", name)


def run_detaudit(args, env=None, cwd=None, timeout=DEFAULT_TIMEOUT, check=None):
    """Runs `detaudit ARGS...`; returns the CompletedProcess (text stdout/stderr).

    env: extra variables on top of os.environ (a value of None removes the variable).
    check: an expected exit code; an AssertionError with both outputs when it differs."""
    full_env = dict(os.environ)
    full_env.pop("NO_COLOR", None)  # tests that care set it themselves
    for k, v in (env or {}).items():
        if v is None:
            full_env.pop(k, None)
        else:
            full_env[k] = v
    r = subprocess.run([BIN] + [str(a) for a in args], capture_output=True, text=True,
                       env=full_env, cwd=cwd, timeout=timeout)
    if check is not None and r.returncode != check:
        raise AssertionError(
            f"detaudit {' '.join(map(str, args))}: exit {r.returncode}, expected {check}\n"
            f"--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}")
    return r


def load_report(path):
    """A JSON report written with --format json --output PATH, as a dict."""
    with open(path) as f:
        return json.load(f)


def parse_json_output(text):
    """A JSON report printed on stdout."""
    return json.loads(text)


def export_records(run_dir, stream=None):
    """Every record of a run (`detaudit export`), as a list of dicts."""
    args = ["export", run_dir] + (["--stream", stream] if stream else [])
    r = run_detaudit(args, check=0)
    return [json.loads(line) for line in r.stdout.splitlines() if line.strip()]


def export_ops(run_dir, stream=None):
    """The op records of a run, in file order (the comparator's op index is a position here)."""
    return [r for r in export_records(run_dir, stream) if r.get("record") == "op"]


def output_log(run_dir):
    """What the recorded program printed (run-N/output.log)."""
    with open(os.path.join(run_dir, "output.log"), errors="replace") as f:
        return f.read()


def trace_files(run_dir):
    """The .dtr streams of a run directory, sorted."""
    d = os.path.join(run_dir, "streams")
    return sorted(os.path.join(d, n) for n in os.listdir(d) if n.endswith(".dtr"))


def error_lines(stderr):
    """The `detaudit: error:` lines of a stderr text."""
    return [l for l in stderr.splitlines() if l.startswith("detaudit: error:")]


def make_tmpdir(prefix="detaudit_e2e_"):
    """A fresh temporary directory; remove it with remove_tmpdir."""
    return tempfile.mkdtemp(prefix=prefix)


def remove_tmpdir(path):
    if path and os.environ.get("DETAUDIT_KEEP_TMP") != "1":
        shutil.rmtree(path, ignore_errors=True)


class TempDir:
    """with TempDir() as d: ...  (kept when DETAUDIT_KEEP_TMP=1, for debugging)"""

    def __init__(self, prefix="detaudit_e2e_"):
        self.prefix = prefix
        self.path = None

    def __enter__(self):
        self.path = make_tmpdir(self.prefix)
        return self.path

    def __exit__(self, *exc):
        remove_tmpdir(self.path)
        return False
