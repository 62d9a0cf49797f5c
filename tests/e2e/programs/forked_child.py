"""A process forked after its parent ran a parallel region, whose child runs small ops only: it
never opens a parallel region of its own (libgomp's team is the parent's, and one would wait for
threads the fork left behind), so the recorder must not open one for it either.

    python forked_child.py [--ops 400]
"""
import argparse
import os

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=400)
    args = ap.parse_args()
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    c = a @ b  # the parent's OpenMP team exists from here on
    pid = os.fork()
    if pid == 0:
        x = torch.ones(100, 30)
        for _ in range(args.ops):
            x = x * 1.0001 + x.t().t()  # below torch's grain size, and no VML call
        print(f"child {x[0, 0].item():.6f}", flush=True)
        os._exit(0)
    _, code = os.waitpid(pid, 0)
    print(f"parent {float(c.abs().sum()):.3f} child exit {code}", flush=True)


if __name__ == "__main__":
    main()
