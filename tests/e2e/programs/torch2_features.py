"""torch 2.x APIs in one seeded training loop: torch.accelerator picks the device, torch.func
computes per-sample gradients, and Adam runs its foreach or fused implementation.

    python torch2_features.py --steps 3 --impl foreach|fused
"""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--impl", choices=["foreach", "fused"], default="foreach")
    args = ap.parse_args()
    torch.manual_seed(0)
    device = (torch.accelerator.current_accelerator() if torch.accelerator.is_available()
              else torch.device("cpu"))
    net = nn.Linear(8, 4).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2, foreach=args.impl == "foreach",
                           fused=args.impl == "fused")
    x = torch.randn(16, 8, device=device)
    y = torch.randn(16, 4, device=device)

    def sample_loss(params, xi, yi):
        return F.mse_loss(torch.func.functional_call(net, params, (xi,)), yi)

    per_sample_grad = torch.func.vmap(torch.func.grad(sample_loss), in_dims=(None, 0, 0))
    for _ in range(args.steps):
        opt.zero_grad()
        params = {k: v.detach() for k, v in net.named_parameters()}
        g = per_sample_grad(params, x.unsqueeze(1), y.unsqueeze(1))
        loss = F.mse_loss(net(x), y) + 1e-3 * g["weight"].norm()
        loss.backward()
        opt.step()
    print(f"final loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
