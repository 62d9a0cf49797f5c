"""Writes, on a GPU, bytes that an open device batch is still to digest, in every way the recorder
must see before it launches the batch: the very next op in place, through a view, out=, another
stream after wait_stream, a storage resized to 0 (FSDP's way of freeing, outside any op) whose
memory the caching allocator hands to the next tensor, an optimizer's in-place step, and fills
and copies whose digests come from their value and source (Linear's addmm copies its bias).
Deterministic: recorded with one launch for many ops and with a launch per op, the two runs'
digests must be identical (tests/gpu/test_batched_digests.py).

    python batch_hazards_cuda.py [--steps 3]
"""
import argparse

import torch


def step(k):
    x = torch.arange(1 << 16, dtype=torch.float32, device="cuda") * (k + 1)
    y = x * 2
    y.add_(1)                          # the very next op, in place
    y[100:200].mul_(3)                 # through a view
    z = torch.empty_like(x)
    torch.mul(x, 0.5, out=z)           # out=
    torch.add(x, y, out=z)             # out= on what the batch holds
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        z.mul_(0.25)                   # another stream writes it
    torch.cuda.current_stream().wait_stream(side)
    w = x + 3                          # held; its memory is then freed under the batch
    w.untyped_storage().resize_(0)
    fresh = torch.full((1 << 16,), 7.0, device="cuda")  # may reuse w's memory at once
    # Digested from their value or source, not read: the same bits as the kernel's read.
    known = torch.zeros((), device="cuda")
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.bool):
        f = torch.empty(300, dtype=dtype, device="cuda").fill_(k + 1.3)
        known = known + f.double().sum().float()
    zeroed = torch.empty(1000, device="cuda").zero_()
    zeroed.add_(k)
    src = torch.arange(512, dtype=torch.float32, device="cuda").view(16, 32) * (k + 1)
    dst = torch.empty(16, 32, device="cuda").copy_(src)
    src.mul_(2)                        # the source written after the copy
    known = known + zeroed.sum() + dst.sum() + src.sum()
    return (z.sum() + y.sum() + fresh.sum() + known) * 1e-9


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                              torch.nn.Linear(128, 1)).cuda()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    data = torch.randn(32, 64, device="cuda")
    for k in range(args.steps):
        opt.zero_grad()
        loss = net(data).pow(2).mean() + step(k)
        loss.backward()
        opt.step()                     # every parameter, in place
        print(f"step {k} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    main()
