"""Shared helpers for the end-to-end tests: run the detaudit CLI, record a program under the real
interposer, read a run back as a list of dicts (`detaudit export`), temporary directories.

ctest sets DETAUDIT_BIN, DETAUDIT_BUILD_DIR, DETAUDIT_SOURCE_DIR, and per torch DETAUDIT_PYTHON
(the interpreter whose torch the Python programs use) and DETAUDIT_TORCH_BIN (the C++ programs
built against that torch). Run by hand from tests/e2e/, the defaults point at <source>/build and
<source>/.venv:

    DETAUDIT_PYTHON=../../.venv/bin/python ../../.venv/bin/python -m unittest -v test_record_python
"""
import concurrent.futures
import fnmatch
import functools
import glob
import hashlib
import inspect
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import unittest.mock

SOURCE_DIR = os.environ.get(
    "DETAUDIT_SOURCE_DIR",
    os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BUILD_DIR = os.environ.get("DETAUDIT_BUILD_DIR", os.path.join(SOURCE_DIR, "build"))
BIN = os.environ.get("DETAUDIT_BIN", os.path.join(BUILD_DIR, "bin", "detaudit"))
PYTHON = os.environ.get("DETAUDIT_PYTHON", os.path.join(SOURCE_DIR, ".venv", "bin", "python"))
TORCH_BIN = os.environ.get("DETAUDIT_TORCH_BIN") or next(
    iter(sorted(glob.glob(os.path.join(BUILD_DIR, "torch", "*", "bin")))), "")
DEFAULT_TIMEOUT = 300
EXAMPLES = os.path.join(SOURCE_DIR, "examples")
PROGRAMS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs")
sys.path.insert(0, PROGRAMS)
from ports import free_port  # noqa: E402  (one rule for the tests and the programs they start)

_TORCH_PROBE = ("import torch;print(torch.__version__);print(next((l.split()[-1] for l in "
                "open('/proc/self/maps') if '/libtorch_cpu' in l), ''))")


@functools.lru_cache(maxsize=None)
def python_answer(code):
    """What `PYTHON -c CODE` prints (None if it fails), asked once per build and kept in
    BUILD_DIR/e2e-probes: each ask imports torch, 2 s of CPU on pip's torch, and every test file
    of both torches asks. A build (a torch.txt newer than the answer) asks again."""
    key = hashlib.sha1(f"{os.path.realpath(PYTHON)}\0{code}".encode()).hexdigest()[:16]
    path = os.path.join(BUILD_DIR, "e2e-probes", key + ".json")
    built = max((os.path.getmtime(t) for t in glob.glob(
        os.path.join(BUILD_DIR, "lib", "detaudit", "torch", "*", "torch.txt"))), default=0)
    try:
        if os.path.getmtime(path) > built:
            with open(path) as f:
                return json.load(f)["stdout"]
    except (OSError, ValueError, KeyError):
        pass
    r = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True)
    answer = r.stdout if r.returncode == 0 else None
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"python": PYTHON, "code": code, "stdout": answer}, f)
    os.replace(tmp, path)  # atomic: test files of one torch ask at once
    return answer


def python_torch():
    """(torch.__version__, real path of its libtorch_cpu) of PYTHON."""
    answer = python_answer(_TORCH_PROBE)
    if answer is None:
        raise AssertionError(f"{PYTHON} cannot import torch")
    out = answer.split("\n")
    return out[0], os.path.realpath(out[1])


def interposer_for_python():
    """The interposer built for PYTHON's torch, as `detaudit run` would pick it."""
    version, libtorch = python_torch()
    for desc in sorted(glob.glob(os.path.join(BUILD_DIR, "lib", "detaudit", "torch", "*",
                                              "torch.txt"))):
        fields = dict(line.split("=", 1) for line in open(desc).read().splitlines() if "=" in line)
        if fields.get("libtorch_cpu") == libtorch or fields.get("version") == version:
            return os.path.join(os.path.dirname(desc), "libdetaudit_hooks.so")
    raise AssertionError(f"no interposer in {BUILD_DIR} for torch {version} ({libtorch})")


HOOKS = interposer_for_python()
TORCH_VERSION = python_torch()[0]
HAS_COMPILE = int(TORCH_VERSION.split(".")[0]) >= 2  # torch.compile (inductor)


def comparator_only(cls):
    """For a test class whose subject is the comparator, a report or the CLI, not how a torch is
    recorded: it runs under pip's torch (2.x) only, once, not again under Debian's 1.13."""
    return unittest.skipIf(TORCH_VERSION.startswith("1."),
                           "the comparator's, reports' and CLI's case: run under pip's torch")(cls)


def params_sha(text):
    """The `params sha256 <hex>` a program printed of its final parameters, or None."""
    m = re.search(r"params sha256 ([0-9a-f]{64})", text)
    return m.group(1) if m else None


def example(name):
    return os.path.join(EXAMPLES, name)


def program(name):
    return os.path.join(PROGRAMS, name)


def build_binary(name):
    """A C++ program built against the torch under test (examples/, tests/bench/)."""
    return os.path.join(TORCH_BIN, name)


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
    r = run_as_group([BIN] + [str(a) for a in args], full_env, cwd, timeout)
    if check is not None and r.returncode != check:
        raise AssertionError(
            f"detaudit {' '.join(map(str, args))}: exit {r.returncode}, expected {check}\n"
            f"--- stdout\n{r.stdout}\n--- stderr\n{r.stderr}")
    return r


def signal_mid_run(out, sig, program_args, flags=(), env=None, at_step=30):
    """Records tests/e2e/programs/train_forever.py PROGRAM_ARGS under `detaudit run --out OUT
    FLAGS`, sends SIG to the target once it printed step AT_STEP; returns (run dir, detaudit's
    exit code, its stderr). Raises AssertionError if the target never started recording."""
    run_dir = os.path.join(out, "run-0")
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.Popen([BIN, "run", "--out", out, "-q", *flags, "--", PYTHON,
                             program("train_forever.py"), *program_args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env)
    try:
        env_path = os.path.join(run_dir, "streams", "r0.main.env.json")
        log = os.path.join(run_dir, "output.log")
        deadline, pid = time.time() + 90, None
        while time.time() < deadline:
            if pid is None and os.path.exists(env_path):
                try:
                    pid = read_json(env_path)["pid"]
                except (ValueError, KeyError):
                    pass  # still being written
            if pid is not None and os.path.exists(log):
                with open(log) as f:
                    if f"step {at_step} " in f.read():
                        break
            time.sleep(0.05)
        if pid is None:
            raise AssertionError("the target never started recording")
        time.sleep(0.3)  # let the writer hand some steps to disk; the target keeps running
        os.kill(pid, sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return run_dir, proc.returncode, stderr


def run_program(argv, env=None, cwd=None, timeout=300):
    """Runs a program directly (no detaudit); returns the CompletedProcess."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return run_as_group(list(argv), full_env, cwd, timeout)


def run_as_group(argv, env, cwd, timeout):
    """subprocess.run in a session of its own: on a timeout every process it started is killed,
    not only the first (detaudit's program, a launcher's ranks), so nothing hung runs on beside
    the next test."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise
    finally:
        log_process_time(argv, time.monotonic() - started)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def log_process_time(argv, seconds):
    """With DETAUDIT_E2E_TIMES=FILE, one line per process a test started: its seconds, the test,
    the command; what tells where the suite's minutes go (tests/e2e/process_times.py sums it)."""
    path = os.environ.get("DETAUDIT_E2E_TIMES")
    if not path:
        return
    test = " ".join(sys.argv[1:])  # a worker thread's stack holds no test
    for f in inspect.stack(0):  # 0: no source lines read
        owner = f.frame.f_locals.get("self", f.frame.f_locals.get("cls"))
        if isinstance(owner, unittest.TestCase):
            test = owner.id()
            break
        if isinstance(owner, type) and issubclass(owner, unittest.TestCase):
            test = f"{owner.__module__}.{owner.__name__}.{f.function}"
            break
    with open(path, "a") as f:
        f.write(json.dumps({"seconds": round(seconds, 2), "test": test, "python": PYTHON,
                            "argv": [os.path.basename(str(a)) for a in argv[:12]]}) + "\n")


def record(out_dir, command, flags=(), env=None, cwd=None, timeout=300):
    """`detaudit run --out OUT_DIR -q FLAGS... -- COMMAND...`.

    Returns (CompletedProcess, path of run-0)."""
    r = run_detaudit(["run", "--out", out_dir, "-q"] + list(flags) + ["--"] + list(command),
                     env=env, cwd=cwd, timeout=timeout)
    return r, os.path.join(out_dir, "run-0")


def record_pair(out, command, flags=(), env=None, teardown_abort_is_torchs=True):
    """`detaudit run --runs 2` with a JSON report in OUT/report.json; returns (proc, report).
    The runs are OUT/run-0 and OUT/run-1. env: as for run_detaudit.

    torch's own gloo sometimes aborts a rank at interpreter exit (platform-facts.md): the program
    fails (exit 4) after it recorded everything. Unless teardown_abort_is_torchs is False, such a
    run's proc.returncode is the gate's verdict on what was recorded, with a note on stderr; any
    other failure (the recorder's included) stays exit 4, with what each process said."""
    report = os.path.join(out, "report.json")
    r = run_detaudit(["run", "--runs", "2", "--out", out, "--format", "json", "--output", report,
                      "-q", *flags, "--", *command], env=env)
    if not os.path.exists(report):
        raise AssertionError(f"no report from detaudit run (exit {r.returncode}):\n{r.stderr}")
    verdict = load_report(report)
    if r.returncode == 4 and teardown_abort_is_torchs:
        why = torch_teardown_abort(verdict)
        if why:
            print(f"\nnote: {out}: {why}; the verdict on what was recorded stands "
                  f"(exit {verdict['exit_code']})", file=sys.stderr)
            r = subprocess.CompletedProcess(r.args, verdict["exit_code"], r.stdout, r.stderr)
        else:
            r = subprocess.CompletedProcess(r.args, r.returncode, r.stdout, r.stderr + "\n" +
                                            describe_endings(verdict))
    return r, verdict


def describe_endings(report):
    """How each process of each run ended, from a JSON report's `endings`, for a message."""
    lines = []
    for run in report.get("endings", []):
        lines.append(f"run {run['run']}: program {run['program']}")
        lines += [f"  {p['detail']}" for p in run["processes"]]
    return "\n".join(lines) or "(every process exited)"


def torch_teardown_abort(report):
    """A description when every failure a report's `endings` name is torch's own teardown abort,
    told apart from a recorder failure: some process killed by SIGABRT, and every process that did
    not exit either that, or stopped by its launcher's SIGTERM, each after its last recorded op,
    with whole streams. None otherwise (a crash inside an op, cut streams, a SIGKILL: not that)."""
    aborted = []
    for run in report.get("endings", []):
        for p in run["processes"]:
            if p["ended"] not in ("killed by SIGABRT", "interrupted by SIGTERM"):
                return None
            if not p["after_last_recorded_op"] or not p["streams_whole"]:
                return None
            if p["ended"] == "killed by SIGABRT":
                aborted.append(f"run {run['run'].upper()} {p['process']}")
    if not aborted:
        return None
    return "torch aborted " + ", ".join(aborted) + " at teardown, after its last recorded op"


def in_parallel(calls, workers=2):
    """Runs zero-argument callables concurrently (subprocesses do the work); returns their results
    in order. Recording several programs at once keeps the suite fast on 2 cores."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def export_records(run_dir, stream=None, check=True):
    """Every record of a run (`detaudit export`) as a list of dicts. With check, a nonzero exit
    raises; without, returns (records, CompletedProcess)."""
    args = ["export", run_dir]
    if stream:
        args += ["--stream", stream]
    r = run_detaudit(args)
    records = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    if check:
        if r.returncode != 0:
            raise AssertionError(f"detaudit export {run_dir} exited {r.returncode}: {r.stderr}")
        return records
    return records, r


def ops(records, name=None, phase=None, stream=None):
    """The op records, optionally only those whose name matches the glob `name`, of `phase` or of
    `stream`."""
    out = []
    for rec in records:
        if rec.get("record") != "op":
            continue
        if name is not None and not fnmatch.fnmatchcase(rec["name"], name):
            continue
        if phase is not None and rec["phase"] != phase:
            continue
        if stream is not None and rec["stream"] != stream:
            continue
        out.append(rec)
    return out


def steps(records, stream=None):
    """The step records, optionally of one stream."""
    return [r for r in records
            if r.get("record") == "step" and (stream is None or r["stream"] == stream)]


def values_with(values, key):
    """The dict values holding `key` in an inputs/outputs list, lists flattened."""
    out = []
    for v in values:
        if isinstance(v, list):
            out.extend(values_with(v, key))
        elif isinstance(v, dict) and key in v:
            out.append(v)
    return out


def tensors(values):
    """The tensor values in an inputs/outputs list, lists flattened."""
    return values_with(values, "tensor")


def skipped(values):
    """The TENSOR_SKIPPED values ({"skipped": reason}) in an inputs/outputs list."""
    return values_with(values, "skipped")


def digests(values):
    return [t["digest"] for t in tensors(values) if "digest" in t]


def collectives(records, stream):
    """(op record, collective record) of each collective of a stream, in the order the ops ran.

    COLLECTIVE records come in the order their Works completed (gloo may finish a later bucket
    first), so they are put back in op order here, as the diff does."""
    ops = {r["order"]: r for r in records if r["record"] == "op" and r["stream"] == stream}
    calls = [c for c in records if c["record"] == "collective" and c["stream"] == stream]
    return [(ops[c["order"]], c) for c in sorted(calls, key=lambda c: c["order"])]


def stream_files(run_dir):
    d = os.path.join(run_dir, "streams")
    return sorted(f for f in os.listdir(d) if f.endswith(".dtr")) if os.path.isdir(d) else []


def read_json(path):
    with open(path) as f:
        return json.load(f)


def make_temp_dir(prefix="detaudit_e2e_"):
    return tempfile.mkdtemp(prefix=prefix)


def remove_dir(path):
    shutil.rmtree(path, ignore_errors=True)


# Helpers of the comparator tests.

def load_report(path):
    """A JSON report written with --format json --output PATH, as a dict."""
    with open(path) as f:
        return json.load(f)


def audit(out, command, flags=(), timeout=600, env=None):
    """`detaudit run --runs 2` with a JSON report at OUT.json: (CompletedProcess, report).
    env: as for run_detaudit."""
    r = run_detaudit(["run", "--runs", "2", "--out", out, "-q", "--format", "json", "--output",
                      out + ".json", *flags, "--", *command], timeout=timeout, env=env)
    if not os.path.exists(out + ".json"):
        raise AssertionError(f"no report (exit {r.returncode}): {r.stderr[-3000:]}")
    return r, load_report(out + ".json")


def planted_audit(out, command, flags=(), timeout=600, env=None):
    """Three runs of a recall matrix's COMMAND, the third planted (`--plant-run run-2`): run-0
    against run-1 is the unplanted pair, run-0 against run-2 the planted one, one clean run
    fewer than two audits. A dict: run (CompletedProcess), clean and planted (reports), log
    (the planted run's output)."""
    r = run_detaudit(["run", "--runs", "3", "--out", out, "-q", "--format", "json", "--output",
                      out + ".json", *flags, "--", *command, "--plant-run", "run-2"],
                     timeout=timeout, env=env)
    reports = [f"{out}.run-{i}.json" for i in (1, 2)]
    if not all(map(os.path.exists, reports)):
        raise AssertionError(f"no reports (exit {r.returncode}): {r.stderr[-3000:]}")
    return {"run": r, "clean": load_report(reports[0]), "planted": load_report(reports[1]),
            "log": output_log(os.path.join(out, "run-2")), "dir": out}


def warm_compile_cache(directory, *commands, timeout=900):
    """A torch.compile cache in DIRECTORY, filled by a plain run of each of COMMANDS side by side;
    returns the environment that hands it to `detaudit run`'s runs (run_detaudit's env) and the
    plain runs' results, in COMMANDS' order (what the program computes unrecorded).

    Each recorded run compiles from an empty cache of its own by default, as a user's do
    (docs/how-it-works.md): on these 2 cores a small program's cold compile is most of a minute.
    Runs that all load what the plain runs compiled load alike, and inductor's loaded modules
    have their kernels recorded on a hit as on a miss. Without torch.compile: no cache, {}, []."""
    if not HAS_COMPILE:
        return {}, []
    env = {"TORCHINDUCTOR_CACHE_DIR": os.path.join(directory, "torchinductor")}
    plain = in_parallel([lambda c=c: run_program(c, env=env, timeout=timeout) for c in commands])
    for r in plain:
        if r.returncode != 0:
            raise AssertionError(f"{' '.join(r.args)}: exit {r.returncode}\n{r.stderr[-3000:]}")
    return env, plain


def divergent_steps(report):
    """Every step a report's spread or first divergence names."""
    steps = {p["step"] for p in report["spread"]["per_step"]}
    if report.get("first_divergence"):
        steps.add(report["first_divergence"]["step"])
    return steps


def parse_json_output(text):
    """A JSON report printed on stdout."""
    return json.loads(text)


def export_ops(run_dir, stream=None):
    """The op records of a run, in file order (the comparator's op index is a position here)."""
    return [r for r in export_records(run_dir, stream) if r.get("record") == "op"]


def output_log(run_dir):
    """What the recorded program printed (run-N/output.log)."""
    with open(os.path.join(run_dir, "output.log"), errors="replace") as f:
        return f.read()


def outputs_of_pair(out, lines=40):
    """The last lines each run of record_pair(OUT) printed, for a failure's message."""
    said = []
    for i in (0, 1):
        path = os.path.join(out, f"run-{i}", "output.log")
        text = output_log(os.path.dirname(path)) if os.path.exists(path) else "(no output.log)"
        said.append(f"--- run-{i}/output.log, last {lines} lines:\n"
                    + "\n".join(text.splitlines()[-lines:]))
    return "\n".join(said)


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


def sleeping_waits():
    """The programs a test starts wait in OpenMP by sleeping (OMP_WAIT_POLICY=PASSIVE), for a
    test of a tiny-op loop with no race; a decorator or a `with`. By default an OpenMP thread
    spins at each parallel region's barrier (about 300,000 turns): with two test files and their
    programs on 2 cores, a thread spins through its share while the one it waits for is off its
    core. long_run.py's 800 steps recorded in full took 74 s beside another test file, 5 s with
    sleeping waits. How a thread waits changes no result, but a race needs the default: with
    sleeping waits the second thread wakes late, and long_run.py's race (2^20 values then) came
    back in a full recording in 4 of 12 audits on torch 1.13, against 4 of 4 (2026-11-30)."""
    return unittest.mock.patch.dict(os.environ, {"OMP_WAIT_POLICY": "PASSIVE"})


class TmpDirCase(unittest.TestCase):
    """A test class with a temporary directory of its own, cls.tmp."""
    tmp = None

    @classmethod
    def setUpClass(cls):
        cls.tmp = make_tmpdir()

    @classmethod
    def tearDownClass(cls):
        remove_tmpdir(cls.tmp)


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


class RecordedRuns(unittest.TestCase):
    """Records every job once per class, in parallel; tests read them with records(name).

    A subclass defines jobs_to_record() -> {name: command} or {name: (flags, command)}."""

    @classmethod
    def jobs_to_record(cls):
        raise NotImplementedError

    @classmethod
    def setUpClass(cls):
        cls.tmp = make_temp_dir()
        cls.jobs = cls.jobs_to_record()
        specs = {n: j if isinstance(j, tuple) else ([], j) for n, j in cls.jobs.items()}
        names = list(specs)
        results = in_parallel([lambda n=n: record(os.path.join(cls.tmp, n), specs[n][1],
                                                  flags=specs[n][0]) for n in names])
        cls.runs = dict(zip(names, results))
        cls._records = {}

    @classmethod
    def tearDownClass(cls):
        remove_dir(cls.tmp)

    def records(self, name):
        """The exported records of a run; fails the test if recording or export failed."""
        r, run_dir = self.runs[name]
        self.assertEqual(r.returncode, 0, f"detaudit run {self.jobs[name]}: {r.stdout[-3000:]} {r.stderr}")
        if name not in self._records:
            self._records[name] = export_records(run_dir)
        return self._records[name]
