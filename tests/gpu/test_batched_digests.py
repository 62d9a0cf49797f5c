"""One launch for many ops (record.device_batch_mib) against a launch per op, on a GPU: every
write the recorder must launch a batch before (programs/batch_hazards_cuda.py) leaves the two
recordings' digests identical, and the .status says why batches were launched, including the
caching allocator's free of a resized storage. The per-op run reads every output
(DETAUDIT_KNOWN_OUTPUTS=off): the batched run's fills and copies, digested from their value and
source, must be the bits the kernel reads. The fused kernel (DETAUDIT_DEVICE_KERNEL=fused:
one CUDA call a launch, completion from a word it writes) records the same digests again."""
import os
import re

import gpulib

PROGRAM = gpulib.program("batch_hazards_cuda.py")



def test_batched_digests_are_the_per_op_digests(gpu):
    argv = [gpulib.PYTHON, PROGRAM, "--steps", "3"]
    with gpulib.TempDir() as tmp:
        batched, run_a = gpulib.record_one(os.path.join(tmp, "batched"), argv,
                                           flags=["--digest", "device"])
        assert batched.returncode == 0, gpulib.describe(batched)
        # Every output read: the fills and copies the batched run digests from their value and
        # source must be the bits the kernel reads.
        per_op, run_b = gpulib.record_one(os.path.join(tmp, "per-op"), argv,
                                          flags=["--digest", "device", "--device-batch-mib", "0"],
                                          env={"DETAUDIT_KNOWN_OUTPUTS": "off"})
        assert per_op.returncode == 0, gpulib.describe(per_op)
        line = gpulib.device_digest_status(run_a)
        print(line)
        print(gpulib.device_digest_status(run_b))
        for reason in ("in place", "freed", "step"):
            assert re.search(rf"\b{reason} \d+", line), f"no launch for {reason!r}: {line}"
        assert " 0 tensors failed" in line, line
        known = re.search(r"not read: (\d+) fills, (\d+) copies", line)
        assert known and int(known.group(1)) >= 3 * 6 and int(known.group(2)) >= 3, line
        assert "not read:" not in gpulib.device_digest_status(run_b)
        diff = gpulib.run_detaudit(["diff", run_a, run_b])
        assert diff.returncode == 0 and "IDENTICAL" in diff.stdout, (
            f"one launch for many ops recorded other digests than a launch per op:\n"
            f"{diff.stdout[-4000:]}")
        fused, run_c = gpulib.record_one(os.path.join(tmp, "fused"), argv,
                                         flags=["--digest", "device"],
                                         env={"DETAUDIT_DEVICE_KERNEL": "fused"})
        assert fused.returncode == 0, gpulib.describe(fused)
        line = gpulib.device_digest_status(run_c)
        print(line)
        assert " 0 tensors failed" in line, line
        diff = gpulib.run_detaudit(["diff", run_c, run_b])
        assert diff.returncode == 0 and "IDENTICAL" in diff.stdout, (
            f"the fused kernel recorded other digests than the two-pass one:\n"
            f"{diff.stdout[-4000:]}")
