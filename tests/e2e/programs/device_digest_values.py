"""Prints the device digest of two tensors, computed here in pure Python from the spec in
docs/trace-format.md ("The device digest"): an implementation independent of the C++ one, for
test_run_options to compare with what the recorder wrote for the same tensors."""
import json
import struct

import torch

M = (1 << 64) - 1
P1, P2, P3 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9
P4, P5 = 0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & M


def xxh64_round(acc, word):
    return rotl((acc + word * P2) & M, 31) * P1 & M


def avalanche(h):
    h ^= h >> 33
    h = h * P2 & M
    h ^= h >> 29
    h = h * P3 & M
    return h ^ (h >> 32)


def device_digest(data: bytes) -> str:
    n = len(data)
    data += bytes(-n % 8)
    words = struct.unpack(f"<{len(data) // 8}Q", data)
    total = 0
    for leaf in range((len(words) + 511) // 512):
        leaf_words = words[leaf * 512:(leaf + 1) * 512]
        acc = [(leaf * 32 + lane + 1) * P1 & M for lane in range(32)]
        for k, w in enumerate(leaf_words):
            acc[k % 32] = xxh64_round(acc[k % 32], w)
        width = 16
        while width >= 1:
            for lane in range(width):
                acc[lane] = xxh64_round(acc[lane], acc[lane + width])
            width //= 2
        total = (total + avalanche((acc[0] + len(leaf_words) * P5) & M)) & M
    return avalanche((total + n * P4 + P5) & M).to_bytes(8, "little").hex()


a = torch.arange(3001, dtype=torch.float32) * 0.25  # aten::mul's output: 3 leaves, the last short
t = a[:3000].view(60, 50).t()                        # a non-contiguous view
c = t.clone()                                        # aten::clone reads it in logical order
print(json.dumps({"mul_output": device_digest(a.numpy().tobytes()),
                  "clone_input": device_digest(t.contiguous().numpy().tobytes())}))
