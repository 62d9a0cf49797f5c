"""Trains a few seeded steps, prints its result, then dies at exit of SIGABRT: a thread started
from an exit handler calls abort(), as a library's thread does when it meets interpreter teardown
(gloo's, pytorch PR 179291). Every run ends the same way, so two runs diff identical.

    /usr/bin/python3 tests/e2e/programs/abort_at_exit.py --steps 3
"""
import argparse
import atexit
import os
import threading

import torch
import torch.nn as nn


def abort_from_a_thread():
    t = threading.Thread(target=os.abort, name="teardown")
    t.start()
    t.join()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    atexit.register(abort_from_a_thread)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
    for step in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.6f}", flush=True)
    print("done; aborting at exit", flush=True)


if __name__ == "__main__":
    main()
