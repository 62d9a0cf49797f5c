"""Two Python threads with fixed work each, started in a random order (unseeded `random`), then a
short training loop inside `record_function` scopes on the main thread. Deterministic: every
thread computes the same values in every run, whatever order the scheduler gives them.

    python python_threads.py [--spawn-child] [--order 1,0]

With --spawn-child the program also starts a second Python process that imports torch and runs an
op: a recorded child of the same rank, which must get its own name and files.
"""
import argparse
import random
import subprocess
import sys
import threading
import time

import torch
from torch.autograd.profiler import record_function


def work(k):
    x = torch.full((4096,), float(k + 1))
    for _ in range(4):
        x = (x * 1.5).sin().cumsum(0) / 4096


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spawn-child", action="store_true")
    ap.add_argument("--order", help="start order, e.g. 1,0 (default: random, unseeded)")
    args = ap.parse_args()
    torch.manual_seed(0)
    threads = [threading.Thread(target=work, args=(k,), name=f"worker-{k}") for k in range(2)]
    order = list(range(len(threads)))
    random.shuffle(order)
    if args.order:
        order = [int(i) for i in args.order.split(",")]
    print("start order", order)
    for i in order:
        threads[i].start()
        time.sleep(random.random() * 0.005)
    for t in threads:
        t.join()
    if args.spawn_child:
        subprocess.run([sys.executable, "-c", "import torch; print(torch.ones(3).sum().item())"],
                       check=True)
    w = torch.nn.Parameter(torch.randn(64))
    opt = torch.optim.SGD([w], lr=0.1)
    for _ in range(2):
        opt.zero_grad()
        with record_function("forward_block"):
            loss = (w * 2).pow(2).sum()
        with record_function("backward_block"):
            loss.backward()
        opt.step()
    print(f"loss {loss.item().hex()}")


if __name__ == "__main__":
    main()
