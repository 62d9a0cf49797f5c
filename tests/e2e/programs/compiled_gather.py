"""A compiled loss over a gather (embedding-like rows picked by index), trained a few steps: its
backward, an index_put with accumulate, is a C++ kernel inductor generates with atomic adds.

    python compiled_gather.py [--steps 2] [--threads N] [--deterministic] [--dropout]
                              [--workers N]

With 2 or more threads the atomic adds race and the gradient's bits differ run to run;
--deterministic (use_deterministic_algorithms(True) before compiling) makes inductor call aten's
serial index_put_ instead. --dropout adds a seeded dropout inside the compiled region; --workers
feeds the indices through a DataLoader with that many worker processes. Prints a checksum of the
gradient per step (`step K grad checksum C`) and of the parameters at the end.
"""
import argparse
import hashlib

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--dropout", action="store_true")
    ap.add_argument("--workers", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)
    table = torch.nn.Parameter(torch.randn(64, 16))
    weights = torch.randn(200_000, 16)
    batches = [torch.randint(0, 64, (200_000,)) for _ in range(args.steps)]
    loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=args.workers)

    def loss_fn(table, idx, weights):
        rows = table[idx]
        if args.dropout:
            rows = torch.nn.functional.dropout(rows, p=0.1)
        return (rows * weights).sum()

    compiled = torch.compile(loss_fn)
    opt = torch.optim.SGD([table], lr=1e-4)
    for step, idx in enumerate(loader):
        opt.zero_grad()
        compiled(table, idx, weights).backward()
        grad = hashlib.sha256(table.grad.numpy().tobytes()).hexdigest()[:16]
        print(f"step {step} grad checksum {grad}", flush=True)
        opt.step()
    print("params sha256 " + hashlib.sha256(table.detach().numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
