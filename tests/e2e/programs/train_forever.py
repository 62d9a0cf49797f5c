"""Trains a small MLP until it is killed, printing each step: for the crash-safety tests (SIGKILL,
and SIGTERM as CI runners and schedulers send it). With --spin-threads N, N Python threads run ops
of their own meanwhile; with --steps N it stops after N steps, and with --then-wait it then
waits to be killed, running no op.

    python tests/e2e/programs/train_forever.py [--spin-threads 2] [--steps N [--then-wait]]
"""
import argparse
import threading
import time

import torch
import torch.nn as nn


def spin(k):
    x = torch.full((256,), float(k + 1))
    while True:
        x = (x * 1.0001).sin() + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spin-threads", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0, help="0: until killed")
    ap.add_argument("--then-wait", action="store_true")
    args = ap.parse_args()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(64, 32)
    y = torch.randn(64, 4)
    # Started once the optimizer is built: building it imports torch._dynamo (seconds of CPU on
    # torch 2.x), which threads spinning beside it would only slow down.
    for k in range(args.spin_threads):
        threading.Thread(target=spin, args=(k,), name=f"spin-{k}", daemon=True).start()
    step = 0
    while not args.steps or step < args.steps:
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        step += 1
    if args.then_wait:
        print("waiting", flush=True)
        time.sleep(3600)


if __name__ == "__main__":
    main()
