"""A training loop that asks for a tool which is not installed (`git`, `nvidia-smi` on a machine
without them), the usual way: subprocess in a try block. CPython starts the child with vfork;
its exec fails and it leaves through _exit, in the parent's memory. Ops run before and after.

    python missing_tool.py [--steps N]
"""
import argparse
import subprocess

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    w = torch.randn(8, 8, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    x = torch.randn(4, 8)
    for step in range(args.steps):
        try:
            subprocess.run(["/nonexistent/detaudit-test-tool", "--version"], check=False)
        except OSError as e:
            print(f"step {step}: no tool ({type(e).__name__})")
        opt.zero_grad()
        loss = (x @ w).tanh().sum()
        loss.backward()
        opt.step()
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
