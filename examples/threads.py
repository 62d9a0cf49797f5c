"""A large reduction and matmul whose bits depend on the intra-op thread count: run once with
THREADS=1 and once with THREADS=2 and the results differ from the first reduction.

    THREADS=2 /usr/bin/python3 examples/threads.py
    /usr/bin/python3 examples/threads.py --threads 1
"""
import argparse
import os

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=int(os.environ.get("THREADS", "1")))
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    x = torch.randn(5_000_000)  # 5M float32 values: the reduction splits across threads
    w = torch.nn.Parameter(torch.randn(256, 256))
    a = torch.randn(512, 256)
    opt = torch.optim.SGD([w], lr=1e-3)
    for _ in range(args.steps):
        opt.zero_grad()
        total = x.sum()
        loss = (a @ w).pow(2).mean() + total * 1e-6
        loss.backward()
        opt.step()
    # hex shows every bit: the decimal print hides the last-place differences
    print(f"threads {torch.get_num_threads()} sum {total.item().hex()} loss {loss.item().hex()}")


if __name__ == "__main__":
    main()
