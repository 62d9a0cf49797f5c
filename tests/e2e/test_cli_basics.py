"""CLI paths that need no interposer: help, config and flag errors, a missing or mismatched
interposer, refusing to overwrite a run, and a failing program (with a stand-in hooks file).

    DETAUDIT_BIN=build/bin/detaudit .venv/bin/python -m unittest -v test_cli_basics
"""
import json
import os
import shutil
import subprocess
import tempfile
import unittest

from detaudit_testlib import BIN, PYTHON, TORCH_VERSION


def run(args, env=None, cwd=None):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([BIN] + args, capture_output=True, text=True, env=full_env, cwd=cwd,
                          timeout=120)


class CliBasics(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="detaudit_e2e_")
        # A stand-in interposer: an empty file. ld.so says it cannot preload it and goes on.
        self.hooks_dir = os.path.join(self.tmp, "lib")
        os.makedirs(self.hooks_dir)
        self.hooks = os.path.join(self.hooks_dir, "libdetaudit_hooks.so")
        open(self.hooks, "w").close()
        self.env = {"DETAUDIT_HOOKS": self.hooks}

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def write_config(self, obj_or_text):
        path = os.path.join(self.tmp, "config.json")
        with open(path, "w") as f:
            f.write(obj_or_text if isinstance(obj_or_text, str) else json.dumps(obj_or_text))
        return path

    def assert_one_line_error(self, r, code, *needles):
        self.assertEqual(r.returncode, code, r.stderr)
        lines = [l for l in r.stderr.splitlines() if l.startswith("detaudit: error:")]
        self.assertEqual(len(lines), 1, r.stderr)
        for n in needles:
            self.assertIn(n, lines[0])

    def test_help(self):
        r = run(["--help"])
        self.assertEqual(r.returncode, 0)
        for verb in ("run", "show", "export", "diff", "catalog"):
            self.assertIn(verb, r.stdout)
        r = run(["run", "--help"])
        self.assertEqual(r.returncode, 0)
        for flag in ("--config", "--runs", "--out", "--steps", "--ops", "--exclude-ops", "--phases",
                     "--ranks", "--digest", "--no-stats", "--no-inputs", "--seed", "--deterministic",
                     "--threads", "--format", "--output", "--fail-on", "--rtol", "--atol", "--env",
                     "--cwd", "--force"):
            self.assertIn(flag, r.stdout)
        self.assertEqual(run(["--version"]).returncode, 0)

    def test_no_verb_and_unknown_flag_are_usage_errors(self):
        self.assertEqual(run([]).returncode, 2)
        self.assertEqual(run(["run", "--no-such-flag"]).returncode, 2)

    def test_config_error_names_the_field(self):
        path = self.write_config({"select": {"steps": [0, "x"]},
                                  "target": {"command": ["/bin/true"]}})
        r = run(["run", "--config", path], env=self.env)
        self.assert_one_line_error(r, 2, 'field "select.steps[1]"',
                                   'expected an integer or a range like "0-3"', path)

    def test_unknown_config_field_is_named(self):
        path = self.write_config({"runz": 2})
        self.assert_one_line_error(run(["run", "--config", path], env=self.env), 2,
                                   'field "runz"', "unknown field")

    def test_invalid_json(self):
        path = self.write_config('{"runs": ')
        self.assert_one_line_error(run(["run", "--config", path], env=self.env), 2,
                                   "not valid JSON")

    def test_bad_flag_value_names_the_flag(self):
        r = run(["run", "--deterministic", "maybe", "--", "/bin/true"], env=self.env)
        self.assert_one_line_error(r, 2, "--deterministic", "determinism.algorithms")
        r = run(["run", "--steps", "3-1", "--", "/bin/true"], env=self.env)
        self.assert_one_line_error(r, 2, "--steps")

    def test_no_command(self):
        self.assert_one_line_error(run(["run"], env=self.env), 2, "no program to run")

    def test_missing_hooks_library_is_named(self):
        missing = os.path.join(self.tmp, "nowhere", "libdetaudit_hooks.so")
        r = run(["run", "--out", self.tmp + "/a", "--", "/bin/true"],
                env={"DETAUDIT_HOOKS": missing})
        self.assert_one_line_error(r, 2, missing)
        self.assertFalse(os.path.exists(self.tmp + "/a"))

    def test_mismatched_torch_is_refused(self):
        with open(os.path.join(self.hooks_dir, "torch.txt"), "w") as f:
            f.write("version=0.1.0\ncxx11_abi=1\nlibtorch_cpu=/nonexistent/libtorch_cpu.so\n")
        r = run(["run", "--out", self.tmp + "/a", "--", PYTHON, "-c", "pass"], env=self.env)
        self.assert_one_line_error(r, 2, f"imports torch {TORCH_VERSION}", "only for torch 0.1.0",
                                   f"-DDETAUDIT_TORCH={PYTHON}")
        self.assertFalse(os.path.exists(self.tmp + "/a"))

    def test_the_torch_probe_is_remembered_by_the_files_it_read(self):
        # `import torch` costs a second or more: run remembers what the program's Python said,
        # under the interpreter, torch's folder and its files' identity (inode, size, mtime).
        env = {"XDG_CACHE_HOME": os.path.join(self.tmp, "cache")}
        cache = os.path.join(self.tmp, "cache", "detaudit")
        r = run(["run", "--out", self.tmp + "/a", "-q", "--", PYTHON, "-c", "pass"], env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        files = [os.path.join(cache, f) for f in os.listdir(cache)]
        self.assertEqual(len(files), 1, files)
        with open(files[0]) as f:
            length, rest = f.read().split("\n", 1)
        key, answer = rest[:int(length)], rest[int(length):]
        self.assertIn(os.sep + "version.py ", key)
        self.assertEqual(answer.splitlines()[0], TORCH_VERSION)

        # The remembered answer is the one used: another version under the same key is refused.
        with open(files[0], "w") as f:
            f.write(f"{len(key)}\n{key}0.1.0\n1\n/nonexistent/libtorch_cpu.so\n")
        r = run(["run", "--out", self.tmp + "/b", "--", PYTHON, "-c", "pass"], env=env)
        self.assert_one_line_error(r, 2, "imports torch 0.1.0")

        # A remembered key that is not this Python's now (a torch file changed since, or two keys
        # under one name): the torch is asked again, and its answer replaces the one remembered.
        stale = key.replace(os.sep + "version.py ", os.sep + "version.py 1", 1)
        with open(files[0], "w") as f:
            f.write(f"{len(stale)}\n{stale}0.1.0\n1\n/nonexistent/libtorch_cpu.so\n")
        r = run(["run", "--out", self.tmp + "/c", "-q", "--", PYTHON, "-c", "pass"], env=env)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(files[0]) as f:
            self.assertIn(f"\n{TORCH_VERSION}\n", f.read())

    def test_failing_program_exits_4_and_keeps_the_run(self):
        out = os.path.join(self.tmp, "audit")
        r = run(["run", "--out", out, "-q", "--", "/bin/sh", "-c", "echo hi; exit 3"], env=self.env)
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn("run-0 failed (exit code 3)", r.stderr)
        with open(os.path.join(out, "run-0", "run.json")) as f:
            record = json.load(f)
        self.assertEqual(record["exit_code"], 3)
        self.assertIsNone(record["signal"])
        self.assertEqual(record["command"], ["/bin/sh", "-c", "echo hi; exit 3"])
        with open(os.path.join(out, "run-0", "output.log")) as f:
            self.assertIn("hi\n", f.read())
        with open(os.path.join(out, "run-0", "config.json")) as f:
            self.assertEqual(json.load(f)["target"]["command"][0], "/bin/sh")

        # The same directory again is refused, naming --force; --force replaces it.
        r = run(["run", "--out", out, "--", "/bin/true"], env=self.env)
        self.assert_one_line_error(r, 2, "run-0", "--force")
        r = run(["run", "--out", out, "--force", "--", "/bin/true"], env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_killed_program_is_named_by_signal(self):
        out = os.path.join(self.tmp, "audit")
        r = run(["run", "--out", out, "--", "/bin/sh", "-c", "kill -SEGV $$"], env=self.env)
        self.assertEqual(r.returncode, 4, r.stderr)
        self.assertIn("killed by SIGSEGV", r.stderr)
        with open(os.path.join(out, "run-0", "run.json")) as f:
            self.assertEqual(json.load(f)["signal"], "SIGSEGV")

    def test_show_and_export_reject_a_non_run(self):
        self.assertEqual(run(["show", os.path.join(self.tmp, "none")]).returncode, 3)
        self.assertEqual(run(["export", os.path.join(self.tmp, "none")]).returncode, 3)


if __name__ == "__main__":
    unittest.main()
