"""pytest plugin: a test marked `reproducible` (or every test, with `--detaudit`) must give the
same bits twice.

The marked test runs in two fresh pytest processes under `detaudit run --runs 2`, which records
every op, then diffs the runs. A divergence fails the test with the first divergent op, its
class and remedy; the HTML report goes beside the JUnit file (or into --detaudit-out). The test
runs in child processes because the interposer attaches when a process starts: threads and
DataLoader workers are recorded as in any program. Options: docs/config.md, "pytest plugin".
"""
import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from detaudit import executable

_CHILD_ENV = "DETAUDIT_PYTEST_CHILD"
# detaudit's exit codes that the plugin tells apart (docs/exit-codes.md).
_IDENTICAL, _USAGE, _BAD_INPUT, _TARGET_FAILED = 0, 2, 3, 4


def pytest_addoption(parser):
    group = parser.getgroup("detaudit", "reproducibility checks (detaudit)")
    group.addoption("--detaudit", action="store_true", default=False,
                    help="check every test as if it were marked reproducible")
    group.addoption("--detaudit-runs", type=int, default=None,
                    help="how many recorded runs a checked test gets (default 2)")
    group.addoption("--detaudit-out", default=None,
                    help="directory for the runs and reports (default: beside the JUnit "
                         "file, else .detaudit/ in the rootdir)")
    group.addoption("--detaudit-args", default=None,
                    help='more `detaudit run` flags, e.g. "--steps 0-3 --digest xxh3"')
    parser.addini("detaudit_args", "more `detaudit run` flags for every checked test", default="")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "reproducible(runs=2, args=''): run the test twice under detaudit and fail on the first "
        "divergent op")


def _in_child():
    return os.environ.get(_CHILD_ENV) == "1"


def _checked(item):
    return item.get_closest_marker("reproducible") is not None or item.config.getoption("detaudit")


def _cli():
    """$DETAUDIT_CLI, else this installation's compiled CLI."""
    for candidate in (os.environ.get("DETAUDIT_CLI"), executable()):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


def _out_dir(config):
    out = config.getoption("detaudit_out")
    if out:
        return os.path.abspath(out)
    junit = getattr(config.option, "xmlpath", None)
    if junit:
        return os.path.join(os.path.dirname(os.path.abspath(junit)), "detaudit")
    return os.path.join(str(config.rootpath), ".detaudit")


def _slug(nodeid):
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", nodeid).strip("_")[:150]


def _run_flags(item):
    config = item.config
    marker = item.get_closest_marker("reproducible")
    marker_kwargs = marker.kwargs if marker else {}
    runs = marker_kwargs.get("runs") or config.getoption("detaudit_runs") or 2
    flags = shlex.split(config.getini("detaudit_args") or "")
    flags += shlex.split(config.getoption("detaudit_args") or "")
    extra = marker_kwargs.get("args", "")
    flags += shlex.split(extra) if isinstance(extra, str) else list(extra)
    return int(runs), flags


def _child_command(item, junit):
    config = item.config
    # -s: the test's own output lands in each run's output.log, beside the trace.
    command = [sys.executable, "-m", "pytest", item.nodeid, "-q", "-s", "--no-header",
               "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:randomly",
               "--rootdir", str(config.rootpath), f"--junitxml={junit}"]
    if config.inipath:
        command += ["-c", str(config.inipath)]
    return command


def _last_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _describe(report, html):
    first = report.get("first_divergence") or {}
    verdict = report.get("verdict", "?")
    if not first:
        why = report.get("unexplained") or "; ".join(report.get("not_compared", [])[:3])
        return f"detaudit: {verdict}: {why}\n  report: {html}"
    where = (f"rank {first.get('rank')} step {first.get('step')} {first.get('phase')} "
             f"{first.get('op')} (op #{first.get('index')} of {first.get('stream')})")
    lines = [f"detaudit: not reproducible: first divergence at {where}",
             f"  class:  {first.get('class')} - {first.get('detail', '')}"]
    if first.get("cause"):
        lines.append(f"  cause:  {first['cause']}")
    catalog = first.get("catalog") or {}
    if catalog.get("id"):
        lines.append(f"  catalog: {catalog['id']}")
    if first.get("remedy"):
        lines.append(f"  remedy: {first['remedy']}")
    lines.append(f"  report: {html}")
    return "\n".join(lines)


def _failed_run_log(out, runs):
    """The end of the output of the first recorded run whose pytest said it failed."""
    logs = []
    for i in range(runs):
        path = os.path.join(out, f"run-{i}", "output.log")
        if os.path.exists(path):
            with open(path, errors="replace") as f:
                logs.append(f.read())
    failed = [log for log in logs if re.search(r"\b\d+ (failed|errors?)\b", log)]
    return (failed or logs or [""])[0][-4000:]


def _pair_reports(out, runs):
    """run-0 against each later run: (run index, its JSON report path), as `run` names them."""
    if runs == 2:
        return [(1, os.path.join(out, "report.json"))]
    return [(i, os.path.join(out, f"report.run-{i}.json")) for i in range(1, runs)]


def _check(item):
    cli = _cli()
    if cli is None:
        pytest.skip("detaudit: no detaudit CLI found (pip install --no-build-isolation the "
                    "detaudit source, or set DETAUDIT_CLI)")
    runs, flags = _run_flags(item)
    if runs < 2:
        pytest.fail(f"detaudit: runs={runs}: a reproducibility check needs at least 2 runs",
                    pytrace=False)
    out = os.path.join(_out_dir(item.config), _slug(item.nodeid))
    os.makedirs(out, exist_ok=True)
    pairs = _pair_reports(out, runs)
    html = os.path.join(out, "report.html")
    for stale in [path for _, path in pairs] + [html]:
        if os.path.exists(stale):
            os.remove(stale)
    command = [cli, "run", "--runs", str(runs), "--out", out, "--force", "-q",
               "--format", "json", "--output", os.path.join(out, "report.json")] + flags
    command += ["--", *_child_command(item, os.path.join(out, "child-junit.xml"))]
    env = dict(os.environ, **{_CHILD_ENV: "1"})
    done = subprocess.run(command, cwd=str(item.config.rootpath), env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    code = done.returncode
    if code in (_USAGE, _BAD_INPUT) and "interposer" in done.stderr:
        pytest.skip(f"detaudit cannot attach: {_last_line(done.stderr)}")
    if code == _TARGET_FAILED:
        pytest.fail(f"detaudit: the test failed under recording ({_last_line(done.stderr)})\n"
                    f"{_failed_run_log(out, runs)}", pytrace=False)
    reports = []
    for index, path in pairs:
        if not os.path.exists(path):
            pytest.fail(f"detaudit run exited {code} without {path}: "
                        f"{done.stderr.strip()[-2000:]}", pytrace=False)
        with open(path) as f:
            reports.append((index, json.load(f)))
    # The pair to show: the first that is not identical, else run-0 against run-1.
    index, report = next(((i, r) for i, r in reports if r.get("verdict") != "identical"),
                         reports[0])
    # The same diff, rendered for people: beside the JUnit file.
    subprocess.run([cli, "diff", os.path.join(out, "run-0"), os.path.join(out, f"run-{index}"),
                    "--format", "html", "--output", html] + _gate_flags(flags),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    item.user_properties.append(("detaudit_report", html))
    item.user_properties.append(("detaudit_verdict", report.get("verdict", "")))
    if code != _IDENTICAL:
        pytest.fail(_describe(report, html), pytrace=False)


def _gate_flags(flags):
    """The flags of `run` that `diff` takes too: the gate's."""
    kept, i = [], 0
    while i < len(flags):
        flag = flags[i].split("=", 1)[0]
        if flag in ("--fail-on", "--rtol", "--atol"):
            kept += flags[i:i + (1 if "=" in flags[i] else 2)]
            i += 1 if "=" in flags[i] else 2
            continue
        if flag == "--allow-truncated":
            kept.append(flags[i])
        i += 1
    return kept


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A checked test runs only in the recorded children: here its fixtures are not set up, and
    its reports come from the verdict."""
    if _in_child() or not _checked(item):
        return None
    ihook = item.ihook
    ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    for when, call in (("setup", lambda: None), ("call", lambda: _check(item)),
                       ("teardown", lambda: None)):
        info = pytest.CallInfo.from_call(call, when=when)
        ihook.pytest_runtest_logreport(report=pytest.TestReport.from_item_and_call(item, info))
    ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True
