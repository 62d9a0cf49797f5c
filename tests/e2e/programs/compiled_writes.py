"""Bytes that torch.compile's generated kernels write where the dispatcher does not see it: into a
buffer an extern kernel wrote first (inductor's `in_out_ptr`, and buffers it reuses), and into
the program's own tensors (an input mutated inside the compiled function).

    python compiled_writes.py --case CASE [--steps 2] [--threads 2]

  in-place-kernel  relu(x @ W.t() + b) * 2: addmm writes the buffer, then a generated kernel
                   rewrites it in place
  mutate-input     p.add_(g * 0.1) compiled: a generated kernel writes p, then eager code reads it
  race             index_put(x @ W, idx, vals, accumulate=True) compiled: atomic adds, on 2
                   threads, into the buffer the extern mm wrote

Each step prints `step K md5 HEX` of the tensor an eager op reads next (`(t * 3).sum()`): the
digest the recorder must have for that op's input.
"""
import argparse
import hashlib

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True, choices=["in-place-kernel", "mutate-input", "race"])
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x, W, b = torch.randn(64, 16), torch.randn(16, 16), torch.randn(16)
    p, g = torch.randn(64, 16), torch.randn(64, 16)
    idx, vals = torch.randint(0, 64, (200_000,)), torch.randn(200_000, 16)

    @torch.compile
    def in_place_kernel(x, W, b):
        return torch.relu(x @ W.t() + b) * 2

    @torch.compile
    def mutate_input(p, g):
        p.add_(g * 0.1)

    @torch.compile
    def race(x, W, idx, vals):
        return torch.index_put(x @ W, (idx,), vals, accumulate=True)

    for step in range(args.steps):
        if args.case == "in-place-kernel":
            t = in_place_kernel(x, W, b)
        elif args.case == "mutate-input":
            mutate_input(p, g)
            t = p
        else:
            t = race(x, W, idx, vals)
        print(f"step {step} md5 {hashlib.md5(t.numpy().tobytes()).hexdigest()}", flush=True)
        (t * 3).sum()


if __name__ == "__main__":
    main()
