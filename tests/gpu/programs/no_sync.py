"""Does recording synchronize the GPU? A kernel that spins for about 200 ms is enqueued, then 100
small ops; if nothing waited for the GPU, the stream is still busy when the host has issued
them all. Prints `no-sync busy=<bool> issue_ms=<host time for the 100 ops> sleep_ms=<kernel>`.
Recorded or not, the program is the same; the test compares.

With --kinds, each kind of op a training step of real models runs (a channels_last convolution,
batch norm and pooling under bf16 autocast, as ResNet-50 runs them; a GPT-2 block's layer norm,
attention and GELU; a loss, its backward, SGD and AdamW steps) is probed alone behind its own
long kernel, and a line `kind NAME busy=<bool>` says whether the stream was still busy after it:
a recorder that synchronizes in one of them is named there."""
import argparse
import time

import torch
import torch.nn.functional as F


def kinds(dev):
    """{name: a callable that issues that kind of op}, on small tensors of real models' shapes."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(dev)

    conv = torch.nn.Conv2d(16, 32, 3, padding=1).to(dev, memory_format=torch.channels_last)
    bn = torch.nn.BatchNorm2d(32).to(dev)
    img = rand(8, 16, 32, 32).to(memory_format=torch.channels_last).requires_grad_()
    block = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True,
                                             norm_first=True, activation="gelu").to(dev)
    tokens = rand(4, 16, 64).requires_grad_()
    head = torch.nn.Linear(64, 10).to(dev)
    labels = torch.randint(0, 10, (4,), generator=g).to(dev)
    sgd = torch.optim.SGD(list(conv.parameters()) + list(bn.parameters()), lr=0.1, momentum=0.9)
    adamw = torch.optim.AdamW(list(block.parameters()) + list(head.parameters()), lr=1e-3)
    state = {}

    def resnet_forward():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = F.relu(bn(conv(img)))
            state["cnn"] = F.adaptive_avg_pool2d(F.max_pool2d(y, 2), 1).float().sum()

    def gpt_forward():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            h = block(tokens, is_causal=True,
                      src_mask=torch.nn.Transformer.generate_square_subsequent_mask(16, device=dev))
            state["gpt"] = F.cross_entropy(head(h[:, -1]).float(), labels)

    def backward():
        (state["cnn"] + state["gpt"]).backward()

    return {"resnet forward (channels_last, bf16 autocast)": resnet_forward,
            "gpt block forward (bf16 autocast, dropout)": gpt_forward,
            "backward": backward, "sgd step": sgd.step, "adamw step": adamw.step,
            "zero_grad": lambda: (sgd.zero_grad(), adamw.zero_grad())}


def probe_kinds(dev, cycles):
    work = kinds(dev)
    for _ in range(3):  # warm-up: cuDNN's plans, the optimizers' state, first-use costs
        for fn in work.values():
            fn()
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    for name, fn in work.items():
        torch.cuda._sleep(cycles)
        fn()
        busy = not stream.query()
        torch.cuda.synchronize()
        print(f"kind {name} busy={busy}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", type=int, default=100)
    ap.add_argument("--sleep-ms", type=float, default=200.0)
    ap.add_argument("--kinds", action="store_true", help="probe each kind of a step's ops")
    args = ap.parse_args()
    dev = torch.device("cuda")
    x = torch.randn(1024, device=dev)
    y = torch.randn(1024, device=dev)
    # Warm-up: lazy initialisation, kernel loading and the recorder's first-use costs are paid
    # here, not inside the measured window.
    for _ in range(20):
        y = y + x
    torch.cuda.synchronize()
    # Cycles per millisecond of torch.cuda._sleep, measured rather than taken from the clock
    # rate, which boost and throttling change.
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    cycles = int(10_000_000 * args.sleep_ms / start.elapsed_time(end))
    torch.cuda.synchronize()
    if args.kinds:
        return probe_kinds(dev, cycles)

    stream = torch.cuda.current_stream()
    start.record()
    torch.cuda._sleep(cycles)
    t0 = time.perf_counter()
    for _ in range(args.ops):
        y = y + x
    issue_ms = (time.perf_counter() - t0) * 1e3
    busy = not stream.query()
    end.record()
    end.synchronize()
    print(f"no-sync busy={busy} issue_ms={issue_ms:.3f} sleep_ms={start.elapsed_time(end):.3f} "
          f"ops={args.ops}")
    print(f"result {y.sum().item():.9e}")


if __name__ == "__main__":
    main()
