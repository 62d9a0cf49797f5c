"""An optimizer whose update is a custom op that writes its parameter through data_ptr, though
its schema says it writes nothing: the shape of a C++ extension's kernel that mutates an argument
it does not declare. `run --selftest` must name the write as a blind spot: a change planted in it
is seen only where the next step reads the parameter.

    python hidden_write.py [--steps N]
"""
import argparse
import ctypes

import torch

LIB = torch.library.Library("detaudit_hidden", "DEF")
LIB.define("sgd_update(Tensor param, Tensor grad, float lr) -> ()")


def sgd_update(param, grad, lr):
    # No torch op runs here: the bytes change behind the dispatcher, as a kernel's would.
    n = param.numel()
    p = (ctypes.c_float * n).from_address(param.data_ptr())
    g = (ctypes.c_float * n).from_address(grad.data_ptr())
    for i in range(n):
        p[i] = p[i] - lr * g[i]


LIB.impl("sgd_update", sgd_update, "CPU")


class HiddenSGD(torch.optim.Optimizer):
    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    torch.ops.detaudit_hidden.sgd_update(p, p.grad.contiguous(), group["lr"])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = HiddenSGD(model.parameters(), lr=0.05)
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for _ in range(args.steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
