"""Unmodified Python training scripts recorded under the real interposer: every forward, backward
and optimizer op with digests and statistics, steps from the optimizers' own marks, phases,
sequence numbers, RNG digests of random ops, views left out, uninitialized outputs flagged,
non-tensor arguments, DataLoader worker streams and the environment fingerprint.

    cd tests/e2e && ../../.venv/bin/python -m unittest -v test_record_python
"""
import collections
import os
import re
import stat
import unittest

from detaudit_testlib import (RecordedRuns, HOOKS, PYTHON, SOURCE_DIR, example, export_records, in_parallel,
                              make_temp_dir, ops, program, read_json, record, remove_dir,
                              run_detaudit, steps, stream_files, tensors)

SGD_STEPS = 3
ADAM_STEPS = 3
LBFGS_STEPS = 2
LOADER_STEPS = 3
FEATURE_STEPS = 2

# (name in the trace, shape) of train_sgd.py's parameters, in model order.
SGD_PARAM_SHAPES = [[8, 3, 3, 3], [8], [16, 8, 3, 3], [16], [10, 16], [10]]
ADAM_PARAM_COUNT = 6  # two Linear and one LayerNorm, weight and bias each


class RecordPython(RecordedRuns):
    @classmethod
    def jobs_to_record(cls):
        return {
            "sgd": [PYTHON, example("train_sgd.py"), "--steps", str(SGD_STEPS)],
            "adam": [PYTHON, example("train_adam.py"), "--steps", str(ADAM_STEPS)],
            "lbfgs": [PYTHON, example("train_lbfgs.py"), "--steps", str(LBFGS_STEPS)],
            "loader": [PYTHON, example("dataloader_workers.py"), "--steps", str(LOADER_STEPS)],
            "features": [PYTHON, program("op_features.py"), "--steps", str(FEATURE_STEPS)],
        }

    def output_log(self, name):
        with open(os.path.join(self.runs[name][1], "output.log")) as f:
            return f.read()

    # --- helpers ---------------------------------------------------------------------------

    def assert_hashed(self, op):
        """Every tensor value the op describes has an MD5 digest, and floats have statistics."""
        for t in tensors(op["inputs"]) + tensors(op["outputs"]):
            if "dtype" not in t:
                continue  # a reference beyond the reader's window
            self.assertRegex(t["digest"], r"^[0-9a-f]{32}$", op)
            if t.get("uninitialized") and t in tensors(op["inputs"]) and t["provenance"] == "view":
                # A read of bytes the program's torch.empty returned and no op wrote: hashed,
                # to be compared; its base is the empty's output.
                self.assertNotEqual(t["digest"], "0" * 32, op)
            elif t.get("uninitialized") or t.get("not_read"):
                # Uninitialized bytes, and bytes the op overwrites unread, are not hashed: a zero
                # digest and no statistics.
                self.assertEqual(t["digest"], "0" * 32, op)
                self.assertIsNone(t["stats"], op)
            elif t["dtype"] in ("float32", "float64"):
                self.assertIsInstance(t["stats"], dict, op)
                for k in ("min", "max", "mean", "l2"):
                    self.assertIn(k, t["stats"], op)

    def assert_steps_follow_optimizer(self, records, optimizer_steps):
        """STEP records: one per optimizer step (+1 when ops run after the last one); the ops of
        step k end with the optimizer phase and come before every op of step k+1."""
        main = [o for o in ops(records) if o["stream"] == "r0.main.t-main"]
        self.assertTrue(main)
        step_recs = steps(records, "r0.main.t-main")
        opt = [o for o in main if o["phase"] == "optimizer"]
        self.assertTrue(opt, "no optimizer-phase op")
        last_opt = max(o["order"] for o in opt)
        after = [o for o in main if o["order"] > last_opt]
        expected = optimizer_steps + (1 if after else 0)
        self.assertEqual(len(step_recs), expected,
                         [(s["step"], s["order"]) for s in step_recs])
        self.assertEqual([s["step"] for s in step_recs], list(range(expected)))
        self.assertEqual(sorted({o["step"] for o in opt}), list(range(optimizer_steps)))
        for o in after:
            self.assertEqual(o["step"], optimizer_steps, o["name"])
        # Program order is step order.
        by_order = sorted(main, key=lambda o: o["order"])
        self.assertEqual([o["step"] for o in by_order], sorted(o["step"] for o in by_order))
        # Each STEP record's order is that of an op of its step.
        for s in step_recs:
            self.assertIn(s["order"], {o["order"] for o in main if o["step"] == s["step"]})
        return main

    # --- SGD -------------------------------------------------------------------------------

    def test_sgd_forward_backward_optimizer_ops_with_digests(self):
        recs = self.records("sgd")
        main = ops(recs)
        self.assertGreater(len(main), 100)
        for o in main:
            self.assert_hashed(o)
        for k in range(SGD_STEPS):
            step_ops = [o for o in main if o["step"] == k]
            count = collections.Counter((o["name"], o["phase"], o["scope"]) for o in step_ops)
            for name, n in (("aten::convolution", 2), ("aten::relu", 2),
                            ("aten::max_pool2d_with_indices", 1), ("aten::addmm", 1),
                            ("aten::log_softmax", 1)):
                self.assertEqual(count[(name, "forward", "function")], n, (k, name, count))
            for name, n in (("ConvolutionBackward0", 2), ("ReluBackward0", 2),
                            ("MaxPool2DWithIndicesBackward0", 1), ("AddmmBackward0", 1),
                            ("NllLossBackward0", 1), ("LogSoftmaxBackward0", 1)):
                self.assertEqual(count[(name, "backward", "backward_function")], n,
                                 (k, name, count))
            # SGD with momentum ends with param.add_(buf, alpha=-lr) for each parameter.
            updates = [o for o in step_ops
                       if o["name"] == "aten::add_" and o["phase"] == "optimizer"
                       and o["inputs"][2] == -0.05]
            self.assertEqual(sorted(tuple(u["inputs"][0]["shape"]) for u in updates),
                             sorted(tuple(s) for s in SGD_PARAM_SHAPES), k)
            # The parameter changed: the update's output is a new version with a new digest.
            for u in updates:
                self.assertNotEqual(u["inputs"][0].get("digest"), u["outputs"][0].get("digest"))

    def test_sgd_addmm_output_is_the_product_not_the_bias(self):
        # addmm(bias, x, w.t()) copies the bias into its result (a nested aten::copy_), then a
        # GEMM adds x @ w.t() in place without the dispatcher. The recorded output must be the
        # product, not the broadcast bias the copy_ left.
        recs = self.records("sgd")
        by_order = sorted(ops(recs), key=lambda o: o["order"])
        checked = 0
        for i, o in enumerate(by_order):
            if o["name"] != "aten::addmm" or o["phase"] != "forward":
                continue
            nested = by_order[i + 1]
            self.assertEqual((nested["name"], nested["depth"]), ("aten::copy_", o["depth"] + 1))
            self.assertNotEqual(o["outputs"][0]["digest"], nested["outputs"][0]["digest"],
                                f"step {o['step']}: addmm output digest is its bias copy's")
            checked += 1
        self.assertEqual(checked, SGD_STEPS)

    def test_sgd_steps_follow_the_optimizer(self):
        recs = self.records("sgd")
        main = self.assert_steps_follow_optimizer(recs, SGD_STEPS)
        for k in range(SGD_STEPS):
            step_ops = sorted((o for o in main if o["step"] == k), key=lambda o: o["order"])
            phases = [o["phase"] for o in step_ops]
            # zero_grad (optimizer phase) may open the step; the optimizer's step() closes it.
            last_backward = len(phases) - 1 - phases[::-1].index("backward")
            # Allocations aside (record_function's own handle, torch.zeros, opens the mark).
            after = [o["phase"] for o in step_ops[last_backward + 1:]
                     if o["depth"] == 0 and o["name"] not in ("aten::zeros", "aten::empty")]
            self.assertEqual(set(after), {"optimizer"}, k)
            self.assertLess(phases.index("forward"), phases.index("backward"))

    def test_sgd_backward_nodes_carry_their_forward_seq_nr(self):
        recs = self.records("sgd")
        forward_by_seq = collections.defaultdict(set)
        for o in ops(recs, phase="forward"):
            if o["seq_nr"] is not None:
                forward_by_seq[(o["step"], o["seq_nr"])].add(o["name"])
        pairs = {"AddmmBackward0": "aten::addmm", "ConvolutionBackward0": "aten::convolution",
                 "ReluBackward0": "aten::relu", "NllLossBackward0": "aten::nll_loss_forward",
                 "LogSoftmaxBackward0": "aten::_log_softmax"}
        nodes = [o for o in ops(recs, phase="backward") if o["scope"] == "backward_function"]
        self.assertTrue(nodes)
        # Nodes of views (whose forward ops are not recorded) and leaves have no recorded partner.
        unpaired = {"TBackward0", "ReshapeAliasBackward0", "ViewBackward0",
                    "torch::autograd::AccumulateGrad"}
        seen = set()
        for node in nodes:
            if node["name"] in unpaired:
                continue
            self.assertIsNotNone(node["seq_nr"], node["name"])
            key = (node["step"], node["seq_nr"])
            self.assertIn(key, forward_by_seq, node["name"])
            if node["name"] in pairs:
                self.assertIn(pairs[node["name"]], forward_by_seq[key], node["name"])
                seen.add(node["name"])
        self.assertEqual(seen, set(pairs))

    def test_views_are_not_recorded(self):
        recs = self.records("sgd") + self.records("features")
        names = {o["name"] for o in ops(recs)}
        for view in ("aten::view", "aten::t", "aten::transpose", "aten::as_strided",
                     "aten::detach", "aten::_reshape_alias", "aten::expand", "aten::flatten",
                     "aten::select", "aten::slice", "aten::alias", "aten::unsqueeze"):
            self.assertNotIn(view, names)
        # The views were there: addmm reads the weight through aten::t, a transposed view.
        addmm = ops(recs, "aten::addmm", phase="forward")
        self.assertTrue(addmm)
        for o in addmm:
            weight = o["inputs"][2]
            if "dtype" in weight:
                self.assertIsNotNone(weight["strides"], o)  # non-contiguous: a transpose
                self.assertEqual(weight["provenance"], "view")

    def test_manual_detach_records_are_not_recorded(self):
        # `detach` and `detach_` reach RecordFunction from autograd's hand-written kernels, with
        # no schema: they are views all the same and carry no output.
        names = {o["name"] for o in ops(self.records("sgd"))}
        self.assertTrue({"aten::conv2d", "aten::addmm"} <= names)
        self.assertNotIn("detach", names)
        self.assertNotIn("detach_", names)

    def test_environment_fingerprint(self):
        self.records("sgd")
        run_dir = self.runs["sgd"][1]
        env = read_json(os.path.join(run_dir, "streams", "r0.main.env.json"))
        self.assertIsInstance(env["intra_op_threads"], int)
        self.assertGreaterEqual(env["intra_op_threads"], 1)
        self.assertIsInstance(env["inter_op_threads"], int)
        for k in ("deterministic_algorithms", "warn_only", "deterministic_cudnn",
                  "benchmark_cudnn"):
            self.assertIsInstance(env["determinism"][k], bool, k)
        self.assertFalse(env["determinism"]["deterministic_algorithms"])
        for var in ("OMP_NUM_THREADS", "PYTHONHASHSEED", "CUBLAS_WORKSPACE_CONFIG", "LD_PRELOAD"):
            self.assertIn(var, env["env"])
        self.assertIn("libdetaudit_preload.so", env["env"]["LD_PRELOAD"])
        # The interposer's libtorch: torch.txt has the Python's version, "2.13.0+cpu".
        with open(os.path.join(os.path.dirname(HOOKS), "torch.txt")) as f:
            built = dict(l.split("=", 1) for l in f.read().splitlines())["version"]
        self.assertEqual(env["torch_version"], re.match(r"\d+\.\d+\.\d+", built).group(0))
        self.assertTrue(env["python"])
        self.assertEqual(env["process_role"], "main")
        self.assertEqual(env["rank"], 0)
        self.assertIn("train_sgd.py", " ".join(env["command_line"]))
        self.assertEqual(env["digest"], "md5")
        # The STEP records say the same about threads.
        for s in steps(self.records("sgd")):
            self.assertEqual(s["intra_op_threads"], env["intra_op_threads"])

    # --- Adam ------------------------------------------------------------------------------

    def test_adam(self):
        recs = self.records("adam")
        self.assert_steps_follow_optimizer(recs, ADAM_STEPS)
        for o in ops(recs):
            self.assert_hashed(o)
        for k in range(ADAM_STEPS):
            count = collections.Counter((o["name"], o["phase"]) for o in ops(recs)
                                        if o["step"] == k)
            self.assertEqual(count[("aten::addcdiv_", "optimizer")], ADAM_PARAM_COUNT, k)
            self.assertEqual(count[("aten::gelu", "forward")], 1, k)
            self.assertEqual(count[("aten::native_layer_norm", "forward")], 1, k)
            self.assertEqual(count[("GeluBackward0", "backward")], 1, k)
            self.assertEqual(count[("NativeLayerNormBackward0", "backward")], 1, k)
            self.assertEqual(count[("aten::addmm", "forward")], 2, k)
            self.assertEqual(count[("AddmmBackward0", "backward")], 2, k)

    # --- LBFGS -----------------------------------------------------------------------------

    def test_lbfgs_closure_passes_inside_one_step(self):
        recs = self.records("lbfgs")
        m = re.search(r"after (\d+) closure calls", self.output_log("lbfgs"))
        self.assertIsNotNone(m, self.output_log("lbfgs"))
        evaluations = int(m.group(1))
        self.assertGreater(evaluations, LBFGS_STEPS)  # several passes in some step
        self.assert_steps_follow_optimizer(recs, LBFGS_STEPS)
        # Two Linear layers: two addmm forward and two AddmmBackward0 a closure call, and the
        # closure's forward ops are labelled forward although the optimizer runs them.
        addmm = ops(recs, "aten::addmm")
        self.assertEqual(len(addmm), 2 * evaluations)
        self.assertEqual({o["phase"] for o in addmm}, {"forward"})
        self.assertEqual(len(ops(recs, "AddmmBackward0", phase="backward")), 2 * evaluations)
        self.assertEqual(len(ops(recs, "aten::tanh", phase="forward")), evaluations)
        for k in range(LBFGS_STEPS):
            in_step = [o for o in ops(recs) if o["step"] == k]
            first_opt = min(o["order"] for o in in_step if o["phase"] == "optimizer")
            later_forward = [o for o in in_step if o["name"] == "aten::addmm"
                             and o["order"] > first_opt]
            later_backward = [o for o in in_step if o["name"] == "AddmmBackward0"
                              and o["order"] > first_opt]
            self.assertTrue(later_forward, f"step {k}: no closure pass after optimizer ops")
            self.assertTrue(later_backward, f"step {k}")
        self.assertEqual({o["phase"] for o in ops(recs, "MseLossBackward0")}, {"backward"})

    # --- random ops, uninitialized outputs, non-tensor arguments ---------------------------

    def test_random_op_carries_rng_digest(self):
        recs = self.records("features")
        bern = ops(recs, "aten::bernoulli_")
        self.assertEqual(len(bern), FEATURE_STEPS)  # one dropout a step
        for o in bern:
            self.assertTrue(o["random"], o)
            self.assertRegex(o["rng"] or "", r"^[0-9a-f]{16}$", o)
            self.assertEqual(o["phase"], "forward")
        # The generator advanced between the two masks.
        self.assertNotEqual(bern[0]["rng"], bern[1]["rng"])
        # Non-random ops carry none.
        for o in ops(recs, "aten::addmm"):
            self.assertFalse(o["random"])
            self.assertIsNone(o["rng"])

    def test_steps_with_ops_after_the_last_optimizer_step(self):
        recs = self.records("features")
        self.assert_steps_follow_optimizer(recs, FEATURE_STEPS)
        self.assertEqual(len(steps(recs, "r0.main.t-main")), FEATURE_STEPS + 1)
        self.assertEqual(ops(recs, "aten::index_put_")[0]["step"], FEATURE_STEPS)

    def test_empty_outputs_are_flagged_uninitialized(self):
        recs = self.records("features")
        empties = [o for o in ops(recs, "aten::empty") if o["depth"] == 0]
        self.assertTrue(empties)
        for o in empties:
            outs = tensors(o["outputs"])
            self.assertTrue(outs)
            for t in outs:
                self.assertTrue(t.get("uninitialized"), o)
        # The buffer once filled is an ordinary, initialized tensor.
        fill = ops(recs, "aten::fill_")
        self.assertTrue(fill)
        for t in tensors(fill[-1]["outputs"]):
            self.assertNotIn("uninitialized", t)
        # No other op's output is flagged.
        for o in ops(recs):
            if o["name"] in ("aten::empty", "aten::empty_like", "aten::empty_strided",
                             "aten::new_empty", "aten::new_empty_strided"):
                continue
            for t in tensors(o["outputs"]):
                self.assertNotIn("uninitialized", t, o["name"])

    def test_non_tensor_arguments_are_recorded(self):
        recs = self.records("features")
        index_put = ops(recs, "aten::index_put_")
        self.assertEqual(len(index_put), 1)
        ins = index_put[0]["inputs"]
        self.assertEqual(len(ins), 4)
        self.assertIs(ins[3], True)  # accumulate=True
        self.assertIsInstance(ins[1], list)  # the indices, a list of tensors
        self.assertEqual(ins[1][0]["dtype"], "int64")
        scatter = ops(recs, "aten::scatter_reduce")
        self.assertEqual(len(scatter), 1)
        self.assertIn("amax", scatter[0]["inputs"])
        self.assertEqual(scatter[0]["inputs"][1], 0)  # dim
        adds = [o for o in ops(recs, "aten::add") if o["step"] == FEATURE_STEPS]
        self.assertTrue(any(o["inputs"][2] == 2.5 for o in adds), [o["inputs"] for o in adds])
        # The result the program printed is the recorded output's statistics.
        m = re.search(r"z \[([^\]]*)\]", self.output_log("features"))
        z = [float(v) for v in m.group(1).split(",")]
        out = [o for o in adds if o["inputs"][2] == 2.5][-1]["outputs"][0]
        self.assertEqual(out["shape"], [len(z)])
        self.assertAlmostEqual(out["stats"]["max"], max(z), places=4)
        self.assertAlmostEqual(out["stats"]["min"], min(z), places=4)

    # --- DataLoader workers ----------------------------------------------------------------

    def test_dataloader_workers_write_their_own_streams(self):
        self.records("loader")
        run_dir = self.runs["loader"][1]
        files = stream_files(run_dir)
        for f in ("r0.main.t-main.dtr", "r0.main.0.t-main.dtr", "r0.main.1.t-main.dtr"):
            self.assertIn(f, files)
        pids = set()
        for f in files:
            name = f[:-len(".dtr")]
            recs, r = export_records(run_dir, stream=name, check=False)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertNotIn("cut short", r.stderr)
            self.assertNotIn("no END record", r.stderr)
            headers = [x for x in recs if x["record"] == "header"]
            self.assertEqual(len(headers), 1, f)
            self.assertEqual(recs[-1]["record"], "end", f)
            self.assertEqual(recs[-1]["ops"], len(ops(recs)), f)
            h = headers[0]
            self.assertEqual(f"r{h['rank']}.{h['process_role']}.t-{h['thread']}", name)
            pids.add(h["pid"])
            names = {o["name"] for o in ops(recs)}
            # One process's program order, from 1, no op twice: nothing of another process.
            orders = sorted(o["order"] for o in ops(recs))
            self.assertEqual(orders[0], 1, f)
            self.assertEqual(len(orders), len(set(orders)), f)
            if h["process_role"] == "main":
                self.assertIn("aten::addmm", names)
                self.assertNotIn("aten::sin", names)  # the dataset's op runs in workers only
            elif h["process_role"] in ("main.0", "main.1"):
                self.assertIn("aten::sin", names)
                self.assertNotIn("aten::addmm", names)
                self.assertNotIn("AddmmBackward0", names)
            env = read_json(os.path.join(run_dir, "streams", f"r0.{h['process_role']}.env.json"))
            self.assertEqual(env["process_role"], h["process_role"])
            self.assertEqual(env["pid"], h["pid"])
        self.assertEqual(len(pids), 3)
        # The whole run reads cleanly too.
        r = run_detaudit(["show", run_dir])
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertNotIn("cut short", r.stdout)

    # --- a launcher in front of the Python -------------------------------------------------

    def test_a_launcher_runs_the_interposer_of_the_python_it_names(self):
        """`env VAR=1 PYTHON ...`, `timeout N PYTHON ...`: that Python's interposer is preloaded
        and the run records. (Before, the launcher hid the Python and the first interposer built
        was preloaded: with torch 1.13's beside it, the program died of SIGBUS.)"""
        for launcher in (["env", "OMP_NUM_THREADS=1"], ["timeout", "300"]):
            r, run_dir = record(os.path.join(self.tmp, "launcher-" + launcher[0]),
                                launcher + [PYTHON, example("train_sgd.py"), "--steps", "1"])
            self.assertEqual(r.returncode, 0, r.stderr)
            run_json = read_json(os.path.join(run_dir, "run.json"))
            self.assertEqual(os.path.realpath(run_json["hooks_library"]), os.path.realpath(HOOKS))
            self.assertTrue(ops(export_records(run_dir)), f"{launcher[0]}: no op recorded")

    def test_only_processes_that_can_run_torch_load_the_interposer(self):
        """A shell and what it runs besides Python (/bin/true, another shell; torch.compile's
        compiler and assembler alike) start without the interposer and its libtorch, which cost
        each of them 1-3 s; the Python records, its trace whole."""
        r, run_dir = record(os.path.join(self.tmp, "children"),
                            ["sh", "-c", f"/bin/true && {PYTHON} {example('train_sgd.py')} "
                                         "--steps 1 && sh -c true"])
        self.assertEqual(r.returncode, 0, r.stderr)
        streams = os.path.join(run_dir, "streams")
        statuses = sorted(f for f in os.listdir(streams) if f.endswith(".status"))
        self.assertEqual(statuses, ["r0.main.status"])
        with open(os.path.join(streams, "r0.main.status")) as f:
            self.assertIn("attached libtorch", f.read())
        records = export_records(run_dir)
        self.assertTrue(ops(records))
        self.assertEqual(records[-1]["record"], "end")

    # --- a Python whose torch is not the interposer's ---------------------------------------

    def test_mismatched_python_torch_is_refused(self):
        fake = os.path.join(self.tmp, "fakebin", "python3")
        os.makedirs(os.path.dirname(fake))
        with open(fake, "w") as f:
            f.write("#!/bin/sh\n"
                    "case \"$2\" in *torch*) echo 0.4.1; echo /opt/fake/torch/__init__.py;"
                    " exit 0;; esac\n"
                    "echo ran >> \"$(dirname \"$0\")/ran\"\n")
        os.chmod(fake, os.stat(fake).st_mode | stat.S_IEXEC)
        out = os.path.join(self.tmp, "mismatch")
        r = run_detaudit(["run", "--out", out, "--", fake, "train.py"])
        self.assertEqual(r.returncode, 2, r.stderr)
        errors = [l for l in r.stderr.splitlines() if l.startswith("detaudit: error:")]
        self.assertEqual(len(errors), 1, r.stderr)
        self.assertIn(f"{fake} imports torch 0.4.1", errors[0])
        self.assertIn(f"build one for it: cmake -S {SOURCE_DIR}/hooks", errors[0])
        self.assertFalse(os.path.exists(os.path.join(os.path.dirname(fake), "ran")))
        self.assertFalse(os.path.exists(os.path.join(out, "run-0")))


if __name__ == "__main__":
    unittest.main()


class ReshapedViews(unittest.TestCase):
    """A tensor read again under another shape keeps the digest of its bytes: a reshape of an op's
    output takes its product's description (not hashed again: the bench's MB hashed a step shows
    it), never the description of what a nested op wrote before the op's own kernel (addmm's bias
    copy), and a large transposed view is the MD5 of its logical bytes."""

    def test_reshapes_keep_the_digest_of_their_bytes(self):
        out = make_temp_dir()
        try:
            proc, run_dir = record(out, [PYTHON, program("reshaped_views.py")])
            self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
            with open(os.path.join(run_dir, "output.log")) as f:
                want = dict(re.findall(r"^(\S+) ([0-9a-f]{32})$", f.read(), flags=re.M))
            recs = export_records(run_dir)
            linear = ops(recs, "aten::linear")[0]
            self.assertEqual(tensors(linear["outputs"])[0]["digest"], want["linear-out"])
            relu_in = tensors(ops(recs, "aten::relu")[0]["inputs"])[0]
            self.assertEqual(relu_in["digest"], want["linear-out"])
            matmul = ops(recs, "aten::matmul")[0]
            self.assertEqual(tensors(matmul["outputs"])[0]["digest"], want["matmul-out"])
            mul = [o for o in ops(recs, "aten::mul") if tensors(o["inputs"])[0]["shape"] == [384, 512]]
            self.assertEqual(len(mul), 1, ops(recs, "aten::mul"))
            self.assertEqual(tensors(mul[0]["inputs"])[0]["digest"], want["transposed"])
        finally:
            remove_dir(out)
