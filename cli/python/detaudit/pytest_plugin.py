"""pytest plugin: a test marked `reproducible` (or every test, with `--detaudit`) must give the
same bits twice; one marked `reproducible(baseline=PATH)` must match a run stored once.

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
import shutil
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
    group.addoption("--detaudit-update-baselines", action="store_true", default=False,
                    help="record each `baseline=` test into its baseline instead of checking it")
    parser.addini("detaudit_args", "more `detaudit run` flags for every checked test", default="")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "reproducible(runs=2, args='', baseline=None): run the test twice under detaudit and "
        "fail on the first divergent op; with baseline=PATH, run it once and diff it against "
        "the run stored there")


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


def _baseline(item):
    """The marker's baseline run directory (relative to the rootdir), or None."""
    marker = item.get_closest_marker("reproducible")
    path = marker.kwargs.get("baseline") if marker else None
    return os.path.join(str(item.config.rootpath), path) if path else None


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
    change = report.get("numerics_change")
    if change:
        moved = change["output"]
        ulps = f", {moved['ulps']:.3g} ulp" if (moved.get("ulps") or -1) >= 0 else ""
        lines.append(f"  numerics changed first at rank {change['rank']} step {change['step']} "
                     f"{change['phase']} {change['op']}: {moved['relative']:.2g} of its "
                     f"scale{ulps}")
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


def _recording_flags(flags):
    """The flags of `run` that `record` takes: all but the gate's."""
    kept, i = [], 0
    while i < len(flags):
        flag = flags[i].split("=", 1)[0]
        if flag == "--allow-truncated":
            i += 1
        elif flag in _GATE_FLAGS:
            i += 1 if "=" in flags[i] else 2
        else:
            kept.append(flags[i])
            i += 1
    return kept


def _recorded_output(run_dir):
    """The end of what the test printed in a `detaudit record` run (its nodes' logs)."""
    nodes = os.path.join(run_dir, "nodes")
    logs = sorted(os.listdir(nodes)) if os.path.isdir(nodes) else []
    text = ""
    for name in logs:
        if name.endswith(".log"):
            with open(os.path.join(nodes, name), errors="replace") as f:
                text += f.read()
    return text[-4000:]


def _is_run_directory(path):
    return os.path.isdir(os.path.join(path, "streams")) or os.path.isdir(
        os.path.join(path, "nodes"))


def _check_against_baseline(item, cli, baseline, flags):
    """Records the test once, then diffs the baseline against it (or records the baseline, with
    --detaudit-update-baselines)."""
    out = os.path.join(_out_dir(item.config), _slug(item.nodeid))
    os.makedirs(out, exist_ok=True)
    update = item.config.getoption("detaudit_update_baselines")
    target = baseline if update else os.path.join(out, "run")
    if os.path.exists(target):
        if not _is_run_directory(target):
            pytest.fail(f"detaudit: {target} exists and is not a detaudit run: move it, or name "
                        f"another baseline", pytrace=False)
        shutil.rmtree(target)
    if not update and not _is_run_directory(baseline):
        pytest.fail(f"detaudit: no baseline run at {baseline}: record it once with pytest "
                    f"--detaudit-update-baselines {item.nodeid}", pytrace=False)
    command = [cli, "record", "--out", target, "-q"] + _recording_flags(flags)
    command += ["--", *_child_command(item, os.path.join(out, "child-junit.xml"))]
    done = subprocess.run(command, cwd=str(item.config.rootpath),
                          env=dict(os.environ, **{_CHILD_ENV: "1"}),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode in (_USAGE, _BAD_INPUT) and "interposer" in done.stderr:
        pytest.skip(f"detaudit cannot attach: {_last_line(done.stderr)}")
    if done.returncode == _TARGET_FAILED:
        pytest.fail(f"detaudit: the test failed under recording ({_last_line(done.stderr)})\n"
                    f"{_recorded_output(target)}", pytrace=False)
    if done.returncode != 0:
        pytest.fail(f"detaudit record exited {done.returncode}: {_last_line(done.stderr)}",
                    pytrace=False)
    if update:
        item.user_properties.append(("detaudit_baseline", baseline))
        return
    report_path, html = os.path.join(out, "report.json"), os.path.join(out, "report.html")
    gate = _gate_flags(flags)
    diff = subprocess.run([cli, "diff", baseline, target, "--format", "json", "--output",
                           report_path] + gate, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    if diff.returncode not in (0, 1, 5, 6) or not os.path.exists(report_path):
        pytest.fail(f"detaudit diff {baseline} {target} exited {diff.returncode}: "
                    f"{_last_line(diff.stderr)}", pytrace=False)
    subprocess.run([cli, "diff", baseline, target, "--format", "html", "--output", html] + gate,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(report_path) as f:
        report = json.load(f)
    item.user_properties.append(("detaudit_report", html))
    item.user_properties.append(("detaudit_verdict", report.get("verdict", "")))
    if diff.returncode != _IDENTICAL:
        pytest.fail(_describe(report, html).replace("not reproducible", "does not match "
                                                    f"the baseline {baseline}", 1), pytrace=False)


def _check(item):
    cli = _cli()
    if cli is None:
        pytest.skip("detaudit: no detaudit CLI found (pip install --no-build-isolation the "
                    "detaudit source, or set DETAUDIT_CLI)")
    runs, flags = _run_flags(item)
    baseline = _baseline(item)
    if baseline:
        _check_against_baseline(item, cli, baseline, flags)
        return
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


_GATE_FLAGS = ("--fail-on", "--rtol", "--atol", "--ulp")


def _gate_flags(flags):
    """The flags of `run` that `diff` takes too: the gate's."""
    kept, i = [], 0
    while i < len(flags):
        flag = flags[i].split("=", 1)[0]
        if flag in _GATE_FLAGS:
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
