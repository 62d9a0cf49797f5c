"""Trains a few seeded steps, prints its result, then dies at exit of SIGABRT: a thread started
from an exit handler calls abort(), as a library's thread does when it meets interpreter teardown
(gloo's, pytorch PR 179291). Every run ends the same way, so two runs diff identical.

    /usr/bin/python3 tests/e2e/programs/abort_at_exit.py --steps 3 [--race both-abort|main-exits]

--race both-abort: two threads abort at once (a second crash while the first is being saved).
--race main-exits: the main thread leaves through _exit(0) while the other thread's abort is
being saved (the interpreter finishing its teardown beside gloo's dying thread).
"""
import argparse
import atexit
import ctypes
import os
import threading
import time

import torch
import torch.nn as nn


# Through ctypes, which lets the GIL go as C code does: os.abort() holds it, and would keep the
# other thread from racing.
LIBC = ctypes.CDLL(None)


def abort_from_a_thread(race):
    if race == "both-abort":
        gate = threading.Barrier(2)
        threads = [threading.Thread(target=lambda: (gate.wait(), LIBC.abort()), name=f"teardown{i}")
                   for i in range(2)]
    else:
        aborting = threading.Event()
        threads = [threading.Thread(target=lambda: (aborting.set(), LIBC.abort()),
                                    name="teardown")]
    for t in threads:
        t.start()
    if race == "main-exits":
        # From the abort's call, not the thread's start: starting a thread on a loaded machine
        # can take longer than the sleep, and the program then exited 0 before aborting.
        aborting.wait()
        time.sleep(0.002)  # inside the abort's save, which takes milliseconds
        LIBC._exit(0)
    for t in threads:
        t.join()


def sgd_step(params, lr):
    """SGD by hand: torch.optim's first call imports torch._dynamo, seconds of CPU on torch 2.x
    in every run, and the optimizer is not what this program is for."""
    with torch.no_grad():
        for p in params:
            p.sub_(p.grad, alpha=lr)
            p.grad = None
    # The step's end, marked as a loop with no torch.optim optimizer marks it for detaudit.
    with torch.autograd.profiler.record_function("detaudit::step"):
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--race", choices=["both-abort", "main-exits"])
    args = ap.parse_args()
    atexit.register(abort_from_a_thread, args.race)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
    for step in range(args.steps):
        loss = nn.functional.cross_entropy(net(x), y)
        loss.backward()
        sgd_step(net.parameters(), lr=0.1)
        print(f"step {step} loss {loss.item():.6f}", flush=True)
    print("done; aborting at exit", flush=True)


if __name__ == "__main__":
    main()
