"""A training step captured whole into a CUDA graph and replayed (PyTorch's "whole network
capture"), or torch.compile's mode="reduce-overhead", which captures and replays graphs itself.

Each step copies its batch into the static input, replays the graph and prints the loss and a
checksum of the parameters. The captured ops' kernels run only at the replays, which run no
callbacks: the recorder must leave the capture intact and never take the bytes a replay rewrote
as known from an earlier step."""
import argparse

import gpu_common
import torch

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=4)
ap.add_argument("--mode", choices=["graph", "compile"], default="graph")
ap.add_argument("--capture-on-current-stream", action="store_true",
                help="run on a stream of the program's own and capture on it, not on "
                     "torch.cuda.graph's own stream")
args = ap.parse_args()
if not torch.cuda.is_available():
    raise SystemExit("needs a CUDA device")
torch.manual_seed(0)
if args.capture_on_current_stream:
    # CUDA cannot capture the legacy default stream: the whole program runs on another one.
    torch.cuda.set_stream(torch.cuda.Stream())

model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                            torch.nn.Linear(128, 10)).cuda()
loss_fn = torch.nn.CrossEntropyLoss()
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
batches = [(gpu_common.data(32, 64, seed=s), gpu_common.data(32, low=0, high=10, seed=100 + s))
           for s in range(args.steps)]


def train_step(x, y):
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss


if args.mode == "compile":
    # The model's forward and backward become CUDA graphs; the optimizer runs eagerly on the
    # gradients the backward graph wrote (a step compiled whole reads them after the next
    # replay has overwritten them).
    compiled = torch.compile(model, mode="reduce-overhead")
    for i, (x, y) in enumerate(batches):
        torch.compiler.cudagraph_mark_step_begin()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(compiled(x), y)
        loss.backward()
        opt.step()
        print(f"step {i} loss {loss.item():.9e} params {gpu_common.checksum(model[0].weight)}",
              flush=True)
else:
    static_x = torch.zeros(32, 64, device="cuda")
    static_y = torch.zeros(32, dtype=torch.long, device="cuda")
    # Warm-up on a side stream, as torch.cuda.graph asks (the optimizer's state is made here).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            train_step(static_x, static_y)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    capture_stream = None
    if args.capture_on_current_stream:
        capture_stream = torch.cuda.current_stream()
        # Read on that stream just before: the recorder's open batch holds the weight there when
        # the captured optimizer step writes it.
        print(f"before capture {gpu_common.checksum(model[0].weight)}", flush=True)
    with torch.cuda.graph(graph, stream=capture_stream):
        static_loss = loss_fn(model(static_x), static_y)
        static_loss.backward()
        opt.step()
    for i, (x, y) in enumerate(batches):
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        # Ops that read what the replay wrote: the recorder must digest its bytes anew each step.
        seen = static_loss.clone()
        print(f"step {i} loss {seen.item():.9e} params {gpu_common.checksum(model[0].weight)}",
              flush=True)
torch.cuda.synchronize()
