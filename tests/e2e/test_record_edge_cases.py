"""Tensors that are hard to record: sparse, quantized, meta, inference-mode, complex and
non-contiguous tensors, and a parameter changed through `.data`. Each is recorded (hashed, or
TENSOR_SKIPPED with a reason), never a crash, and the program prints the same results with and
without the interposer. Digests are of the logical element order and follow `.data` writes.

    cd tests/e2e && ../../.venv/bin/python -m unittest -v test_record_edge_cases
"""
import os
import re
import unittest

from detaudit_testlib import (PYTHON, export_records, in_parallel, make_temp_dir, ops, program,
                              record, remove_dir, run_program, skipped, tensors)

SCRIPT = program("edge_tensors.py")
RESULT_LINE = re.compile(r"^(sparse|quantized|inference|complex|noncontig|data|made|numpy|meta|param|intview) ")
KNOWN_REASONS = {"sparse or non-strided layout", "quantized", "meta tensor (no data)",
                 "nested tensor", "mkldnn tensor", "no storage", "unsupported dtype"}


class RecordEdgeCases(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = make_temp_dir()
        calls = [
            lambda: run_program([PYTHON, SCRIPT]),
            lambda: record(os.path.join(cls.tmp, "all"), [PYTHON, SCRIPT]),
            # Only the ops that read the parameter: the `.data` write itself goes unrecorded.
            lambda: record(os.path.join(cls.tmp, "filtered"), [PYTHON, SCRIPT],
                           flags=["--ops", "aten::linear,aten::tanh"]),
            # Writes through NumPy bypass torch: only --rehash-inputs sees them.
            lambda: record(os.path.join(cls.tmp, "rehash"), [PYTHON, SCRIPT],
                           flags=["--rehash-inputs"]),
        ]
        cls.plain, cls.all, cls.filtered, cls.rehash = in_parallel(calls)
        cls._records = {}

    @classmethod
    def tearDownClass(cls):
        remove_dir(cls.tmp)

    def records(self, which="all"):
        r, run_dir = getattr(self, which)
        self.assertEqual(r.returncode, 0, r.stderr)
        if which not in self._records:
            self._records[which] = export_records(run_dir)
        return self._records[which]

    def printed(self):
        """The script's own report: {key: [md5, ...]} from the plain run."""
        self.assertEqual(self.plain.returncode, 0, self.plain.stderr)
        out = {}
        for line in self.plain.stdout.splitlines():
            if RESULT_LINE.match(line):
                words = line.split()
                out[" ".join(w for w in words if not re.fullmatch(r"[0-9a-f]{32}", w))] = \
                    [w for w in words if re.fullmatch(r"[0-9a-f]{32}", w)]
        return out

    def all_digests(self, recs, where="outputs"):
        return {t["digest"] for o in ops(recs) for t in tensors(o[where]) if "digest" in t}

    def test_output_unchanged_and_no_crash(self):
        self.records("all")
        for which in ("all", "filtered"):
            with open(os.path.join(getattr(self, which)[1], "output.log")) as f:
                recorded = [l for l in f.read().splitlines() if RESULT_LINE.match(l)]
            expected = [l for l in self.plain.stdout.splitlines() if RESULT_LINE.match(l)]
            self.assertEqual(len(expected), 17)
            self.assertEqual(recorded, expected, which)

    def test_skipped_tensors_carry_a_reason(self):
        recs = self.records()
        reasons = {}
        for o in ops(recs):
            for v in skipped(o["inputs"]) + skipped(o["outputs"]):
                self.assertIn(v["skipped"], KNOWN_REASONS, o["name"])
                reasons.setdefault(v["skipped"], set()).add(o["name"])
        self.assertIn("sparse or non-strided layout", reasons)
        self.assertIn("quantized", reasons)
        self.assertIn("meta tensor (no data)", reasons)
        self.assertIn("aten::quantize_per_tensor", reasons["quantized"])
        self.assertIn("aten::dequantize", reasons["quantized"])
        # The meta add is recorded, with its inputs and output skipped.
        meta_adds = [o for o in ops(recs, "aten::add")
                     if skipped(o["outputs"]) == [{"skipped": "meta tensor (no data)"}]]
        self.assertEqual(len(meta_adds), 1)
        self.assertEqual(len(skipped(meta_adds[0]["inputs"])), 2)

    def test_only_allocations_have_uninitialized_outputs(self):
        # torch.linspace and dequantize allocate their result with a nested aten::empty, then
        # fill it in the kernel: their outputs carry the empty's garbage digest and its flag.
        # resize_ (of out= buffers) leaves bytes no op wrote too.
        flagged = set()
        for o in ops(self.records()):
            if o["name"] in ("aten::empty", "aten::empty_like", "aten::empty_strided",
                             "aten::new_empty", "aten::new_empty_strided", "aten::resize_"):
                continue
            if any(t.get("uninitialized") for t in tensors(o["outputs"])):
                flagged.add(o["name"])
        self.assertEqual(flagged, set())

    def test_sparse_ops_are_recorded(self):
        recs = self.records()
        self.assertEqual(len(ops(recs, "SparseAddmmBackward0", phase="backward")), 1)
        mm = ops(recs, "aten::_sparse_mm")
        self.assertEqual(len(mm), 1)
        self.assertEqual(skipped(mm[0]["inputs"]), [{"skipped": "sparse or non-strided layout"}])
        self.assertEqual(mm[0]["outputs"][0]["shape"], [4, 2])

    def test_sparse_mm_output_digest_is_its_value(self):
        out_md5 = self.printed()["sparse"][0]
        mm = ops(self.records(), "aten::_sparse_mm")
        self.assertEqual(mm[0]["outputs"][0]["digest"], out_md5)

    def test_sparse_backward_result_digest_is_its_value(self):
        grad_md5 = self.printed()["sparse"][1]
        backward = [o for o in ops(self.records(), "aten::mm", phase="backward")
                    if o["outputs"][0].get("shape") == [3, 2]]
        self.assertEqual(len(backward), 1)
        self.assertEqual(backward[0]["outputs"][0]["digest"], grad_md5)

    def test_quantized_inference_and_complex_results_are_hashed(self):
        recs = self.records()
        printed = self.printed()
        digests = self.all_digests(recs)
        self.assertIn(printed["quantized"][0], digests)
        # view_as_real shares the complex tensor's bytes: the complex output has that digest.
        complex_outs = {t["digest"] for o in ops(recs) for t in tensors(o["outputs"])
                        if t.get("dtype") == "complex64"}
        self.assertIn(printed["complex"][0], complex_outs)
        # Inference-mode ops are recorded like any other: relu(...) * 3 is the printed tensor.
        mul = [o for o in ops(recs, "aten::mul")
               if o["outputs"][0].get("digest") == printed["inference"][0]]
        self.assertEqual(len(mul), 1)
        self.assertEqual(mul[0]["outputs"][0]["shape"], [5, 3])
        relu_out = {o["outputs"][0].get("digest") for o in ops(recs, "aten::relu")}
        self.assertIn(mul[0]["inputs"][0]["digest"], relu_out)

    def test_non_contiguous_digest_is_that_of_the_contiguous_copy(self):
        recs = self.records()
        with open(os.path.join(self.all[1], "output.log")) as f:
            log = f.read()
        in_md5 = re.search(r"noncontig input md5 ([0-9a-f]{32})", log).group(1)
        out_md5 = re.search(r"noncontig output md5 ([0-9a-f]{32})", log).group(1)
        tanh = [o for o in ops(recs, "aten::tanh") if o["inputs"][0].get("shape") == [13, 11]]
        self.assertEqual(len(tanh), 1)
        x = tanh[0]["inputs"][0]
        self.assertEqual(x["strides"], [1, 13])  # the transpose, described as such
        self.assertEqual(x["digest"], in_md5)
        self.assertEqual(tanh[0]["outputs"][0]["digest"], out_md5)

    def test_a_view_as_another_dtype_is_described_as_that_dtype(self):
        recs = self.records()
        with open(os.path.join(self.all[1], "output.log")) as f:
            m = re.search(r"intview input md5 ([0-9a-f]{32}) min (-?\d+) max (-?\d+)", f.read())
        # The Scalar overload and the Tensor one it calls.
        shifts = [o for o in ops(recs, "aten::bitwise_right_shift") if o["inputs"][0].get("shape") == [24]]
        self.assertTrue(shifts)
        for op in shifts:
            x = op["inputs"][0]
            # The float32 tensor's bytes were described just before: the int32 view is not that.
            self.assertEqual(x["dtype"], "int32")
            self.assertEqual(x["digest"], m.group(1))
            self.assertEqual((x["stats"]["min"], x["stats"]["max"]),
                             (int(m.group(2)), int(m.group(3))))

    def test_every_layout_digest_is_that_of_the_contiguous_copy(self):
        recs = self.records()
        with open(os.path.join(self.all[1], "output.log")) as f:
            printed = dict(re.findall(r"layout (\w+) md5 ([0-9a-f]{32})", f.read()))
        self.assertEqual(len(printed), 9)
        sum_inputs = {o["inputs"][0].get("digest") for o in ops(recs, "aten::sum")}
        for name, digest in printed.items():
            self.assertIn(digest, sum_inputs, name)
        # With 2 intra-op threads, the large tensors' leaves were not all hashed on the op's own.
        with open(os.path.join(self.all[1], "streams", "r0.main.status")) as f:
            status = f.read()
        # Up to 4 MiB, a tensor's leaves go through the MD5 batch, whose full batches run on the
        # intra-op threads; beyond, they are hashed in place on torch's threads.
        m = re.search(r"large tensors: (\d+), (\d+) of (\d+) units hashed on torch's other threads",
                      status)
        batches = re.search(r"(\d+) on the intra-op threads", status)
        self.assertTrue(m or batches, status)
        self.assertGreater((int(m.group(2)) if m else 0) + (int(batches.group(1)) if batches else 0),
                           0, status)

    def check_data_write(self, which):
        recs = self.records(which)
        with open(os.path.join(getattr(self, which)[1], "output.log")) as f:
            log = f.read()
        before = re.search(r"param before md5 ([0-9a-f]{32})", log).group(1)
        after = re.search(r"param after md5 ([0-9a-f]{32})", log).group(1)
        self.assertNotEqual(before, after)
        linears = [o for o in ops(recs, "aten::linear") if o["inputs"][1].get("shape") == [2, 9]]
        self.assertEqual(len(linears), 4, which)
        self.assertEqual(linears[0]["inputs"][1]["digest"], before, which)
        self.assertEqual(linears[1]["inputs"][1]["digest"], after,
                         f"{which}: the weight's digest after p.data.add_(1) is stale")
        # An op's output changed through .data, then read.
        made = re.search(r"made after md5 ([0-9a-f]{32})", log).group(1)
        self.assertEqual(linears[2]["inputs"][1]["digest"], made,
                         f"{which}: a tensor's digest after t.data.mul_(-3) is stale")

    def numpy_written_input(self, which):
        recs = self.records(which)
        with open(os.path.join(getattr(self, which)[1], "output.log")) as f:
            shared = re.search(r"numpy after md5 ([0-9a-f]{32})", f.read()).group(1)
        linears = [o for o in ops(recs, "aten::linear") if o["inputs"][1].get("shape") == [2, 9]]
        self.assertEqual(len(linears), 4)
        return linears[3]["inputs"][1]["digest"], shared

    def test_numpy_write_is_seen_with_rehash_inputs(self):
        recorded, truth = self.numpy_written_input("rehash")
        self.assertEqual(recorded, truth)
        # ... and the results are still those of the plain run.
        self.assertEqual(self.rehash[0].returncode, 0, self.rehash[0].stderr)

    def test_numpy_write_is_invisible_by_default(self):
        # The documented limit of hashing each version once (docs/config.md, rehash_inputs): a
        # write that bypasses torch keeps the earlier digest. If this starts failing, the default
        # has become stronger and the docs should say so.
        recorded, truth = self.numpy_written_input("all")
        self.assertNotEqual(recorded, truth)

    def test_data_write_is_seen_by_the_next_op(self):
        self.check_data_write("all")

    def test_data_write_is_seen_when_the_write_is_not_recorded(self):
        self.check_data_write("filtered")

    def test_linear_output_digest_is_its_value_when_addmm_is_not_recorded(self):
        recs = self.records("filtered")
        linears = [o for o in ops(recs, "aten::linear") if o["inputs"][1].get("shape") == [2, 9]]
        self.assertEqual([l["outputs"][0]["digest"] for l in linears],
                         self.printed()["data"] + self.printed()["made"] + self.printed()["numpy"])

    def test_overwritten_arguments_are_not_read_and_their_results_are_hashed(self):
        recs = self.records()
        with open(os.path.join(self.all[1], "output.log")) as f:
            truth = dict(re.findall(r"(zero|fill|out) ([0-9a-f]{32})",
                                    re.search(r"^overwrite .*$", f.read(), re.M).group(0)))
        zero = [o for o in ops(recs, "aten::zero_") if o["inputs"][0].get("shape") == [3000]]
        fill = [o for o in ops(recs, "aten::fill_") if o["inputs"][0].get("shape") == [4, 5]]
        add_out = [o for o in ops(recs, "aten::add")
                   if any(t.get("not_read") for t in tensors(o["inputs"]))]
        self.assertEqual((len(zero), len(fill), len(add_out)), (1, 1, 1))
        for op, name in ((zero[0], "zero"), (fill[0], "fill"), (add_out[0], "out")):
            overwritten = tensors(op["inputs"])[-1 if name == "out" else 0]
            self.assertTrue(overwritten.get("not_read"), op["name"])
            self.assertEqual(overwritten["digest"], "0" * 32, op["name"])
            self.assertEqual(op["outputs"][0]["digest"], truth[name], op["name"])
        # What add reads is hashed as usual.
        read = tensors(add_out[0]["inputs"])[0]
        self.assertFalse(read.get("not_read"))
        self.assertEqual(read["digest"], truth["fill"])

    def test_linear_output_digest_is_its_value(self):
        # The linears after .data writes and a recorded write. (The last one reads
        # a tensor written through NumPy: see the numpy_write tests.)
        recs = self.records("all")
        expected = self.printed()["data"] + self.printed()["made"]
        linears = [o for o in ops(recs, "aten::linear") if o["inputs"][1].get("shape") == [2, 9]]
        self.assertEqual([l["outputs"][0]["digest"] for l in linears][:len(expected)], expected)


if __name__ == "__main__":
    unittest.main()
