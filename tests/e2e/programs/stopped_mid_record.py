"""Stop signals that land anywhere in a step, many times in one run: the process forks N children
one after another; each trains a small MLP, prints each step once it is done, and from step 3 on
has a thread of its own send SIGTERM to its main thread after a delay that grows with the child's
number (0.15 ms apart, about a step in all). Each child is a process of its own to detaudit
(r0.main.I), so one run of the program tests N landing points for the price of one torch import.

    python stopped_mid_record.py [--children N]

Prints "child I step S" for each finished step and "child I ended STATUS" from the parent.
"""
import argparse
import os
import signal
import threading
import time

import torch
import torch.nn as nn

STOP_AFTER_STEP = 3
DELAY_APART_S = 0.00015


def child(i):
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                        nn.Linear(64, 4))
    opt = torch.optim.AdamW(net.parameters(), lr=0.01)
    x, y = torch.randn(64, 32), torch.randn(64, 4)
    go = threading.Event()
    main_thread = threading.get_ident()

    def stop():
        go.wait()
        time.sleep(DELAY_APART_S * i)
        signal.pthread_kill(main_thread, signal.SIGTERM)  # the main thread's, wherever it is

    threading.Thread(target=stop, daemon=True).start()
    step = 0
    while True:
        opt.zero_grad()
        loss = nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        print(f"child {i} step {step}", flush=True)
        if step == STOP_AFTER_STEP:
            go.set()
        step += 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--children", type=int, default=24)
    args = ap.parse_args()
    torch.optim.AdamW(nn.Linear(2, 2).parameters())  # what building one imports, imported once
    for i in range(args.children):
        pid = os.fork()
        if pid == 0:
            child(i)
        _, status = os.waitpid(pid, 0)
        print(f"child {i} ended {status}", flush=True)


if __name__ == "__main__":
    main()
