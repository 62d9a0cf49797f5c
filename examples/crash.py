"""Crashes mid-training after a few steps, for the failed-target path: --mode raise ends with an
exception (exit code 1), --mode abort with os.abort() (SIGABRT), after --crash-at steps.

    /usr/bin/python3 examples/crash.py --crash-at 2 --mode abort
"""
import argparse
import os
import sys

import torch
import torch.nn as nn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--crash-at", type=int, default=2)
    ap.add_argument("--mode", choices=["raise", "abort"], default="raise")
    args = ap.parse_args()

    torch.manual_seed(0)
    net = nn.Linear(8, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(16, 8)
    y = torch.randint(0, 2, (16,))
    for step in range(args.crash_at + 10):
        if step == args.crash_at:
            print(f"crashing at step {step} ({args.mode})", flush=True)
            sys.stderr.flush()
            if args.mode == "abort":
                os.abort()
            raise RuntimeError(f"simulated failure at step {step}")
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
