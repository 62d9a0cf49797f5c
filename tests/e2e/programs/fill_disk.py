"""Trains, fills the disk it is given halfway through, and goes on: a thread it starts then, and
its main thread, run ops while the disk has no room left. For the full-disk test: the program's
own result must come out whole, and the recording must fail cleanly.

    python tests/e2e/programs/fill_disk.py --fill /mnt/small/filler
"""
import argparse
import errno
import threading

import torch
import torch.nn as nn


def fill(path):
    chunk = b"\0" * 4096
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise


def sgd_step(params, lr):
    """SGD by hand: torch.optim's first call imports torch._dynamo, seconds of CPU on torch 2.x
    in each of the test's two runs, and the optimizer is not what this program is for."""
    with torch.no_grad():
        for p in params:
            p.sub_(p.grad, alpha=lr)
            p.grad = None
    # The step's end, marked as a loop with no torch.optim optimizer marks it for detaudit.
    with torch.autograd.profiler.record_function("detaudit::step"):
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fill", required=True)
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    x, y = torch.randn(64, 32), torch.randn(64, 4)
    late = None
    for step in range(args.steps):
        if step == args.steps // 2:
            fill(args.fill)
            # A thread whose stream is created only now, with no room for even its header.
            late = threading.Thread(target=lambda: torch.ones(8).sum().item(), name="late")
            late.start()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        sgd_step(net.parameters(), lr=0.01)
        print(f"step {step} loss {loss.item():.6f}", flush=True)
    late.join()
    print("final " + " ".join(f"{p.sum().item():.6f}" for p in net.parameters()), flush=True)


if __name__ == "__main__":
    main()
