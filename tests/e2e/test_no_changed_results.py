"""Recording must not change what a program computes: the final parameters of several training
steps are bit-identical with and without the interposer (Python and C++), compared as exact
bytes or their SHA-256.

    cd tests/e2e && ../../.venv/bin/python -m unittest -v test_no_changed_results
"""
import os
import unittest

from detaudit_testlib import (HOOKS, PYTHON, build_binary, example, in_parallel, make_temp_dir,
                              record, remove_dir, run_program, stream_files)

PY_SCRIPTS = {  # name -> (script, steps)
    "sgd": ("train_sgd.py", 4),
    "adam": ("train_adam.py", 4),
    "lbfgs": ("train_lbfgs.py", 3),
}
CNN_STEPS = 3


class NoChangedResults(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = make_temp_dir()
        calls, cls.keys = [], []

        def params(key):
            return os.path.join(cls.tmp, key + ".params")

        for name, (script, n) in PY_SCRIPTS.items():
            argv = [PYTHON, example(script), "--steps", str(n)]
            calls.append(lambda a=argv, k=name: run_program(a + ["--params-out", params(k + ".plain")]))
            calls.append(lambda a=argv, k=name: record(
                os.path.join(cls.tmp, k), a + ["--params-out", params(k + ".recorded")])[0])
            cls.keys += [name + ".plain", name + ".recorded"]

        cnn = [build_binary("train_cnn"), "--steps", str(CNN_STEPS)]
        calls.append(lambda: run_program(cnn + ["--params-out", params("cnn.plain")]))
        calls.append(lambda: record(os.path.join(cls.tmp, "cnn"),
                                    cnn + ["--params-out", params("cnn.recorded")])[0])
        # LD_PRELOAD by hand, as a user without `detaudit run` would.
        preload_dir = os.path.join(cls.tmp, "cnn-preload")
        calls.append(lambda: run_program(
            cnn + ["--params-out", params("cnn.preload")],
            env={"LD_PRELOAD": HOOKS, "DETAUDIT_RUN_DIR": preload_dir}))
        cls.keys += ["cnn.plain", "cnn.recorded", "cnn.preload"]
        cls.results = dict(zip(cls.keys, in_parallel(calls)))
        cls.params = staticmethod(params)
        cls.preload_dir = preload_dir

    @classmethod
    def tearDownClass(cls):
        remove_dir(cls.tmp)

    def read_params(self, key):
        r = self.results[key]
        self.assertEqual(r.returncode, 0, f"{key}: {r.stderr}")
        with open(self.params(key), "rb") as f:
            data = f.read()
        self.assertGreater(len(data), 0, key)
        return data

    def assert_recorded(self, run_dir):
        self.assertIn("r0.main.t-main.dtr", stream_files(run_dir))
        self.assertGreater(os.path.getsize(os.path.join(run_dir, "streams", "r0.main.t-main.dtr")),
                           10000)

    def check_python(self, name):
        plain = self.read_params(name + ".plain")
        recorded = self.read_params(name + ".recorded")
        self.assertRegex(plain.decode(), r"^[0-9a-f]{64}\n$")
        self.assert_recorded(os.path.join(self.tmp, name, "run-0"))
        self.assertEqual(plain, recorded, f"{name}: parameters changed under the interposer")

    def test_sgd(self):
        self.check_python("sgd")

    def test_adam(self):
        self.check_python("adam")

    def test_lbfgs(self):
        self.check_python("lbfgs")

    def test_cpp_train_cnn(self):
        plain = self.read_params("cnn.plain")
        # 12 float32 parameter tensors of the CNN: the raw bytes, not a digest.
        self.assertGreater(len(plain), 4 * 32 * 8 * 8 * 64)
        self.assertEqual(len(plain) % 4, 0)
        self.assert_recorded(os.path.join(self.tmp, "cnn", "run-0"))
        self.assertEqual(plain, self.read_params("cnn.recorded"),
                         "train_cnn: parameters changed under detaudit run")
        self.assert_recorded(self.preload_dir)
        self.assertEqual(plain, self.read_params("cnn.preload"),
                         "train_cnn: parameters changed under LD_PRELOAD")


if __name__ == "__main__":
    unittest.main()
