"""A seeded model whose CUDA dropout is not: torch.cuda.seed() after the seeded init reseeds the
GPU's generator from the OS, so the first dropout mask differs between runs (the bug detaudit must
call rng-state). Prints the CUDA seed it got, the ground truth for "the runs differed"."""
import torch
import torch.nn as nn

from gpu_common import checksum, parse_args


def main():
    args = parse_args(__doc__)
    net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, 8)).cuda()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.steps, 32, 64, generator=g).cuda()
    y = torch.randint(0, 8, (args.steps, 32), generator=g).cuda()
    torch.cuda.seed()  # the bug: CUDA's generator seeded from the OS
    print(f"cuda seed {torch.cuda.initial_seed()}")
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for step in range(args.steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x[step]), y[step])
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.9e} weight checksum {checksum(net[0].weight)}")


if __name__ == "__main__":
    main()
