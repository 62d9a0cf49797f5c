"""A race that fires only without recording, for `run --validate`'s test. A real one (a thread
that wins only when the ops around it run at full speed) cannot be made to fire on cue, so this
stands in for it: the program reads whether detaudit asked it for its final state, which only
the validate runs do (they record nothing), and then lets the clock pick a weight's last bits.

    python race_unrecorded.py
"""
import os
import time

import torch


def main():
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(16, 8), torch.randn(16, 4)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    if os.environ.get("DETAUDIT_FINAL_STATE"):  # unrecorded: the race fires
        with torch.no_grad():
            model.weight[0, 0] += (time.time_ns() % 997 + 1) * 1e-6
    print("done")


if __name__ == "__main__":
    main()
