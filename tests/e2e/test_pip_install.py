"""detaudit as pip installs it (pyproject.toml): tests/build.sh builds by `pip install
--no-build-isolation .` into <source>/.venv, so that environment's `detaudit`, `python -m
detaudit` and its pytest plugin are tested here, on pip's torch. Under Debian's torch, in the
nightly run (tests/nightly.sh, DETAUDIT_NIGHTLY=1), the test checks that pip's route builds the
same way into a virtual environment over Debian's python: a whole build of the project, 7 of
the 20 minutes CI has, so CI checks the install against pip's torch only.
"""
import json
import os
import re
import subprocess
import textwrap
import unittest
import xml.etree.ElementTree as ET

from detaudit_testlib import PYTHON, SOURCE_DIR, TmpDirCase, example, load_report, output_log

VENV = os.path.join(SOURCE_DIR, ".venv")
VENV_PYTHON = os.path.join(VENV, "bin", "python")
INSTALLED_HERE = os.path.abspath(PYTHON) == os.path.abspath(VENV_PYTHON)
RACE_ATTEMPTS = 4


def run(argv, env=None, cwd=None, timeout=600):
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def grads(run_dir):
    """The per-step gradient hashes nondet_index_put.py printed: the program's own truth."""
    return re.findall(r"step (\d+) grad sha256 (\w+)", output_log(run_dir))


def index_put_verdict(case, launcher, python):
    """Records nondet_index_put.py in pairs with an installed `detaudit` until the program's own
    gradients differ; each verdict must match them. Returns that pair's first divergence."""
    for attempt in range(RACE_ATTEMPTS):
        out = os.path.join(case.tmp, f"audit-{attempt}")
        report = os.path.join(out, "report.json")
        r = run([launcher, "run", "--runs", "2", "--out", out, "-q", "--format", "json",
                 "--output", report, "--", python, example("nondet_index_put.py"), "--steps", "3"])
        a, b = grads(os.path.join(out, "run-0")), grads(os.path.join(out, "run-1"))
        case.assertEqual(len(a), 3, r.stderr + output_log(os.path.join(out, "run-0")))
        verdict = load_report(report)
        if a == b:
            case.assertEqual((r.returncode, verdict["verdict"]), (0, "identical"), r.stderr)
            continue
        case.assertEqual(r.returncode, 1, r.stderr)
        first = verdict["first_divergence"]
        case.assertEqual((first["op"], first["class"]),
                         ("aten::_index_put_impl_", "nondeterministic-op"))
        return first
    case.fail(f"the race never fired in {RACE_ATTEMPTS} pairs")


@unittest.skipUnless(INSTALLED_HERE, "pip's install is into .venv, whose torch is tested there")
class InstalledCommand(TmpDirCase):
    def test_detaudit_is_on_the_environments_path_and_runs_the_packaged_cli(self):
        launcher = os.path.join(VENV, "bin", "detaudit")
        self.assertTrue(os.access(launcher, os.X_OK), f"{launcher}: not installed by pip")
        for argv in ([launcher, "--version"], [VENV_PYTHON, "-m", "detaudit", "--version"]):
            r = run(argv)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertRegex(r.stdout.strip(), r"^\d+\.\d+\.\d+$")
        where = run([VENV_PYTHON, "-c", "import detaudit;print(detaudit.executable())"])
        cli = where.stdout.strip()
        self.assertIn(os.path.join("site-packages", "detaudit", "bin"), cli)
        # The package carries its interposer and catalog: nothing points back at ./build.
        package = os.path.dirname(os.path.dirname(cli))
        r = run([launcher, "catalog", "index_put", "--json"])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("index-put-accumulate-cpu", r.stdout)
        version = run([VENV_PYTHON, "-c", "import torch;print(torch.__version__)"]).stdout.strip()
        self.assertTrue(os.path.exists(os.path.join(package, "lib", "detaudit", "torch", version,
                                                    "libdetaudit_hooks.so")))
        # And its Python side, which records torch.compile's kernels.
        for py in ("sitecustomize.py", "detaudit_compiled_kernels.py"):
            self.assertTrue(os.path.exists(os.path.join(package, "lib", "detaudit", "python", py)),
                            py)

    def test_run_twice_on_the_index_put_race_gives_the_verdict_the_program_shows(self):
        first = index_put_verdict(self, os.path.join(VENV, "bin", "detaudit"), VENV_PYTHON)
        self.assertEqual(first["catalog"]["id"], "index-put-accumulate-cpu")

    def test_an_isolated_build_stops_with_one_line_naming_the_missing_torch(self):
        # Without --no-build-isolation pip builds in a fresh environment that has no torch.
        r = run([VENV_PYTHON, "-m", "pip", "install", "--disable-pip-version-check", SOURCE_DIR,
                 "-C", f"build-dir={os.path.join(self.tmp, 'build')}"], timeout=600)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertRegex(r.stdout + r.stderr,
                         r"detaudit: \S+ cannot import torch: install torch into that environment "
                         r"first; with pip, build with --no-build-isolation")

    def test_a_missing_library_stops_the_build_with_the_debian_package_to_install(self):
        for package, debian in (("CLI11", "libcli11-dev"), ("fmt", "libfmt-dev"),
                                ("OpenSSL", "libssl-dev")):
            r = run(["cmake", "-S", SOURCE_DIR, "-B", os.path.join(self.tmp, package),
                     "-DDETAUDIT_BUILD_HOOKS=OFF", "-DDETAUDIT_BUILD_TESTS=OFF",
                     f"-DCMAKE_DISABLE_FIND_PACKAGE_{package}=TRUE"])
            self.assertNotEqual(r.returncode, 0, r.stdout)
            self.assertIn(f" detaudit: missing build dependency: install Debian's {debian} "
                          f"(sudo apt-get install {debian}), then build again\n", r.stderr)


@unittest.skipUnless(INSTALLED_HERE, "pip's install is into .venv, whose torch is tested there")
class EveryVerbFromTheInstall(TmpDirCase):
    """Each verb as users have it, from the `detaudit` pip put on .venv's PATH: the build tree's
    tests never saw pip's install drop detaudit_replay's execute bit."""

    def installed(self, *args, timeout=600):
        return run([os.path.join(VENV, "bin", "detaudit"), *map(str, args)], timeout=timeout)

    def test_run_diff_show_export_catalog_replay_and_verify_remedy(self):
        out = os.path.join(self.tmp, "audit")
        # run, the diff inside it, and --verify-remedy: an unseeded program, verified with a seed.
        r = self.installed("run", "--runs", "2", "--out", out, "-q", "--verify-remedy", "--format",
                           "json", "--output", os.path.join(out, "report.json"), "--", VENV_PYTHON,
                           os.path.join(SOURCE_DIR, "tests", "e2e", "programs", "print_random.py"))
        self.assertEqual(r.returncode, 1, r.stderr)
        report = load_report(os.path.join(out, "report.json"))
        self.assertEqual(report["first_divergence"]["class"], "rng-state")
        self.assertTrue(report["remedy_verification"]["verified"], report["remedy_verification"])
        self.assertIn("remedy verified: identical with --seed 0", r.stderr)
        a, b = os.path.join(out, "run-0"), os.path.join(out, "run-1")
        d = self.installed("diff", a, b, "--format", "markdown")
        self.assertEqual(d.returncode, 1, d.stderr)
        self.assertIn("rng-state", d.stdout)
        s = self.installed("show", a)
        self.assertEqual(s.returncode, 0, s.stderr)
        self.assertIn("r0.main.t-main", s.stdout)
        e = self.installed("export", a)
        self.assertEqual(e.returncode, 0, e.stderr)
        records = [json.loads(line) for line in e.stdout.splitlines()]
        self.assertEqual(records[-1]["record"], "end")
        c = self.installed("catalog", "index_put")
        self.assertEqual(c.returncode, 0, c.stderr)
        self.assertIn("index-put-accumulate-cpu", c.stdout)
        # replay runs the replayer pip installed beside the interposer.
        first = report["first_divergence"]
        p = self.installed("replay", out, "--op", f"{first['stream']}:{first['index']}",
                           "--replays", "3", "--format", "json")
        self.assertNotIn("Permission denied", p.stderr)
        self.assertEqual(p.returncode, 0, p.stdout + p.stderr)
        replayed = json.loads(p.stdout)
        self.assertEqual(replayed["op"]["name"], first["op"])
        self.assertEqual(replayed["capture"]["status"], "saved", replayed["capture"])


DEBIAN_PYTHON = "/usr/bin/python3"


@unittest.skipUnless(os.path.realpath(PYTHON) == os.path.realpath(DEBIAN_PYTHON),
                     "the route over Debian's python is tested with Debian's torch")
@unittest.skipUnless(os.environ.get("DETAUDIT_NIGHTLY"),
                     "a whole build of the project: nightly (tests/nightly.sh)")
class DebianTorchThroughPip(TmpDirCase):
    def test_pip_builds_for_debians_torch_in_a_venv_over_it_and_records(self):
        venv = os.path.join(self.tmp, "venv")
        r = run([DEBIAN_PYTHON, "-m", "venv", "--system-site-packages", venv])
        self.assertEqual(r.returncode, 0, r.stderr)
        python = os.path.join(venv, "bin", "python")
        version = run([python, "-c", "import torch;print(torch.__version__)"])
        self.assertTrue(version.stdout.startswith("1.13"), version.stdout + version.stderr)
        for argv in (["install", "--disable-pip-version-check", "scikit-build-core==1.1.2"],
                     ["install", "--disable-pip-version-check", "--no-build-isolation",
                      SOURCE_DIR,  # Debian's pip 23.0 has no -C
                      f"--config-settings=build-dir={os.path.join(self.tmp, 'build')}",
                      # -O0 halves the build's 9 CPU minutes: the route is under test here,
                      # not the speed. NDEBUG stays: libtorch's layout depends on it.
                      "--config-settings=cmake.define.CMAKE_CXX_FLAGS_RELEASE=-O0 -DNDEBUG"]):
            r = run([python, "-m", "pip", *argv], timeout=1200)
            self.assertEqual(r.returncode, 0, (r.stdout + r.stderr)[-4000:])
        index_put_verdict(self, os.path.join(venv, "bin", "detaudit"), python)


PLUGIN_TESTS = '''
import os
import torch
import pytest


def train_index_put(steps, threads):
    """index_put_(accumulate=True) in backward: float atomics on {threads} threads."""
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    n = 1 << 17
    w = torch.nn.Parameter(torch.randn(n))
    idx = torch.randint(0, n // 64, (1 << 22,))  # as examples/nondet_index_put.py
    target = torch.randn(idx.numel())
    opt = torch.optim.SGD([w], lr=0.1)
    for step in range(steps):
        opt.zero_grad()
        ((w[idx] - target) ** 2).mean().backward()
        print("grad", step, hash(w.grad.numpy().tobytes()), flush=True)
        opt.step()


@pytest.mark.reproducible
def test_racy_training():
    train_index_put(steps=3, threads=2)


class Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        x = torch.full((8,), float(i))
        return x, x.sum(0, keepdim=True)


@pytest.mark.reproducible
def test_deterministic_training_with_workers_and_threads():
    torch.manual_seed(0)
    torch.set_num_threads(2)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(Squares(), batch_size=16, num_workers=2,
                                         generator=torch.Generator().manual_seed(1),
                                         shuffle=True)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()


@pytest.mark.reproducible(runs=3)
def test_three_runs():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    model(torch.randn(8, 4)).sum().backward()


@pytest.mark.reproducible(baseline="baselines/linear",
                          args="--sentinel --fail-on tolerance --ulp 16")
def test_matches_its_baseline():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=float(os.environ.get("PLUGIN_LR", "0.1")))
    for step in range(3):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()


def test_not_marked_runs_once_in_process():
    assert os.environ.get("DETAUDIT_PYTEST_CHILD") is None
'''


@unittest.skipUnless(INSTALLED_HERE, "the plugin is installed into .venv, whose torch is tested there")
class PytestPlugin(TmpDirCase):
    def pytest(self, *args, env=None):
        suite = os.path.join(self.tmp, "suite")
        os.makedirs(suite, exist_ok=True)
        with open(os.path.join(suite, "test_training.py"), "w") as f:
            f.write(textwrap.dedent(PLUGIN_TESTS))
        junit = os.path.join(self.tmp, "results", "junit.xml")
        r = run([VENV_PYTHON, "-m", "pytest", suite, f"--junitxml={junit}", "-p",
                 "no:cacheprovider", "-rs", *args], env=env, cwd=self.tmp)
        cases = {}
        if os.path.exists(junit):
            for case in ET.parse(junit).getroot().iter("testcase"):
                failure = case.find("failure")
                skipped = case.find("skipped")
                cases[case.get("name")] = (
                    "failed" if failure is not None else "skipped" if skipped is not None
                    else "passed",
                    (failure if failure is not None else skipped).get("message", "")
                    if failure is not None or skipped is not None else "")
        return r, cases, os.path.join(self.tmp, "results", "detaudit")

    def report_dir(self, reports, test):
        found = [d for d in os.listdir(reports) if d.endswith("_" + test)] \
            if os.path.isdir(reports) else []
        self.assertEqual(len(found), 1, f"{reports}: {found}")
        return os.path.join(reports, found[0])

    def test_racy_test_fails_with_the_verdict_and_a_deterministic_one_passes(self):
        for attempt in range(RACE_ATTEMPTS):
            r, cases, reports = self.pytest("-k", "racy or deterministic or not_marked")
            self.assertIn("2 deselected", r.stdout)
            self.assertEqual(cases.get("test_deterministic_training_with_workers_and_threads",
                                       ("missing",))[0], "passed", r.stdout + r.stderr)
            self.assertEqual(cases.get("test_not_marked_runs_once_in_process", ("missing",))[0],
                             "passed", r.stdout)
            racy_dir = self.report_dir(reports, "test_racy_training")
            self.assertTrue(os.path.exists(os.path.join(racy_dir, "report.html")),
                            f"no HTML report beside the JUnit file: {r.stdout}")
            truth = [re.findall(r"grad (\d+) (-?\d+)", output_log(os.path.join(racy_dir, d)))
                     for d in ("run-0", "run-1")]
            self.assertEqual(len(truth[0]), 3, output_log(os.path.join(racy_dir, "run-0")))
            status, message = cases["test_racy_training"]
            if truth[0] == truth[1]:
                # The race did not fire in this pair: identical bits must pass.
                self.assertEqual(status, "passed", message)
                continue
            self.assertEqual(status, "failed", r.stdout)
            self.assertIn("aten::_index_put_impl_", r.stdout)
            self.assertIn("nondeterministic-op", r.stdout)
            self.assertIn("remedy:", r.stdout)
            self.assertIn("use_deterministic_algorithms", r.stdout)
            self.assertNotEqual(r.returncode, 0)
            return
        self.fail(f"the race never fired in {RACE_ATTEMPTS} pairs")

    def test_the_markers_runs_are_recorded_and_every_pair_is_diffed(self):
        r, cases, reports = self.pytest("-k", "three_runs")
        self.assertEqual(cases["test_three_runs"][0], "passed", r.stdout)
        out = self.report_dir(reports, "test_three_runs")
        for i in (1, 2):
            self.assertEqual(load_report(os.path.join(out, f"report.run-{i}.json"))["verdict"],
                             "identical")
        self.assertTrue(os.path.exists(os.path.join(out, "report.html")))

    def test_skips_with_the_reason_when_the_interposer_cannot_attach(self):
        missing = os.path.join(self.tmp, "no-such-interposer.so")
        r, cases, _ = self.pytest("-k", "deterministic", env={"DETAUDIT_HOOKS": missing})
        status, message = cases["test_deterministic_training_with_workers_and_threads"]
        self.assertEqual(status, "skipped", r.stdout)
        self.assertIn("detaudit cannot attach", message)
        self.assertIn(missing, message)
        self.assertEqual(r.returncode, 0, r.stdout)

    def test_detaudit_flag_checks_unmarked_tests_too(self):
        r, cases, reports = self.pytest("-k", "not_marked", "--detaudit")
        # Run as a recorded child, the environment says so; the check passes only if it ran there.
        self.assertEqual(cases["test_not_marked_runs_once_in_process"][0], "failed", r.stdout)
        self.assertIn("failed under recording", cases["test_not_marked_runs_once_in_process"][1])
        run_dir = os.path.join(self.report_dir(reports, "test_not_marked_runs_once_in_process"),
                               "run-0")
        self.assertIn("DETAUDIT_PYTEST_CHILD", output_log(run_dir))

    def test_a_baseline_is_recorded_once_then_later_runs_are_checked_against_it(self):
        baseline = os.path.join(self.tmp, "baselines", "linear")  # the rootdir's
        r, cases, _ = self.pytest("-k", "matches_its_baseline")
        status, message = cases["test_matches_its_baseline"]
        self.assertEqual(status, "failed", r.stdout)
        self.assertIn("no baseline run at", message)
        self.assertIn("--detaudit-update-baselines", message)

        r, cases, _ = self.pytest("-k", "matches_its_baseline", "--detaudit-update-baselines")
        self.assertEqual(cases["test_matches_its_baseline"][0], "passed", r.stdout)
        self.assertTrue(os.path.isdir(os.path.join(baseline, "streams")), r.stdout)

        r, cases, reports = self.pytest("-k", "matches_its_baseline")
        self.assertEqual(cases["test_matches_its_baseline"][0], "passed", r.stdout)
        out = self.report_dir(reports, "test_matches_its_baseline")
        self.assertEqual(load_report(os.path.join(out, "report.json"))["verdict"], "identical")

        # The learning rate doubled: the first update is where the numbers left the tolerance.
        r, cases, _ = self.pytest("-k", "matches_its_baseline", env={"PLUGIN_LR": "0.2"})
        status, message = cases["test_matches_its_baseline"]
        self.assertEqual(status, "failed", r.stdout)
        self.assertIn(f"does not match the baseline {baseline}", r.stdout)
        # The step's one optimizer record: the same gradients in, other parameters out.
        self.assertIn("numerics changed first at rank 0 step 0 optimizer Optimizer.step#SGD.step",
                      r.stdout)
        self.assertIn("the same gradients in, other parameters or state out", r.stdout)


if __name__ == "__main__":
    unittest.main()
