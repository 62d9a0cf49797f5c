"""A small training loop whose optimizer (momentum SGD, written here) has a known order of
reads and writes, printing after each step the MD5 (detaudit's tree above 1 MiB,
docs/trace-format.md) and range of each tensor in the order a sentinel step's state record holds
them: the gradients read, then each momentum buffer and parameter as first written.

    python step_state_digests.py [--steps 3]

Prints `step K read|left md5 DIGEST min X max Y` lines.
"""
import argparse

import torch

from edge_tensors import tree_md5  # detaudit's MD5, beside this file


class Momentum(torch.optim.Optimizer):
    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})
        for group in self.param_groups:
            for p in group["params"]:
                self.state[p]["buf"] = torch.zeros_like(p)

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                buf = self.state[p]["buf"]
                buf.mul_(0.9).add_(p.grad)
                p.add_(buf, alpha=-group["lr"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(2)
    torch.manual_seed(0)
    # Tensors of one leaf, 3 MiB and more of them a step, hashed across threads; a 2 MiB weight
    # (a tree of two leaves, hashed leaf by leaf) among them.
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Tanh(),
                                torch.nn.Linear(512, 1024), torch.nn.Tanh(),
                                torch.nn.Linear(1024, 8))
    opt = Momentum(model.parameters(), lr=1e-2)
    params = list(model.parameters())
    for step in range(args.steps):
        x = torch.randn(16, 512)
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        held = [("read", p.grad) for p in params]
        held += [(role, t) for p in params for role, t in (("left", opt.state[p]["buf"]),
                                                             ("left", p))]
        for role, t in held:
            print(f"step {step} {role} md5 {tree_md5(t)} min {t.min().item()!r} "
                  f"max {t.max().item()!r}")


if __name__ == "__main__":
    main()
