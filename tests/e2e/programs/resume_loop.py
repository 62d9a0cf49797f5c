"""A plain training loop that stops and resumes from a checkpoint, the way users write one
(tests/e2e/test_resume.py): an MLP with dropout, SGD with momentum, a step scheduler, and batches
in an order each epoch draws from its own seeded permutation.

    resume_loop.py --steps N                                   # runs through
    resume_loop.py --steps N --stop-at K --save CK             # stops after step K-1
    resume_loop.py --steps N --resume CK [--omit rng,sampler,epoch,scheduler,scaler,numpy,random,
                   buffers,ema] [--scaler] [--workers W] [--adam] [--numpy-noise]
                   [--python-noise] [--epoch-batches B] [--batchnorm] [--ema]
                   [--augment drawn|seeded] [--persistent]

--omit leaves that state out of what is saved: torch's generator (dropout draws on), the data
loader's place (the resumed loop starts its batches over), the scheduler's state (its LR); or,
with "model" and "optimizer", the resumed loop does not load the parameters or the optimizer's
state. --scaler scales the loss with a GradScaler whose scale doubles each step (torch 2.3 and
later, on the CPU), saved unless "scaler" is left out. --workers W takes the batches from a
DataLoader with W worker processes, its batch sampler started at the loop's place (the same
batches as without workers). --adam steps Adam instead of SGD. --numpy-noise adds noise from
NumPy's global generator to each batch, --python-noise scales it by a factor drawn from Python's
`random`: each generator's state is saved unless "numpy" or "random" is left out.
--epoch-batches B makes an epoch B batches (8); "epoch" left out, the resumed loop keeps its
place in the epoch but takes the first epoch's order. --batchnorm puts a BatchNorm after the
first layer; "buffers" left out, its running statistics are not loaded. --ema keeps an
exponential moving average of the weights, updated after each step with autograd off and saved
unless "ema" is left out (the resumed loop then starts it from the loaded weights).
--augment adds noise to each sample in the Dataset, with --workers in the workers: "drawn"
from the worker's own generator (which no checkpoint holds: a loader made anew starts its
workers' generators over), "seeded" from a generator seeded by the sample's index.
--persistent iterates the workers' loader anew each epoch with persistent_workers=True: its
workers live on across the epochs, and their generators with them.
Prints the last loss.
"""
import argparse
import random

import numpy
import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--stop-at", type=int)
p.add_argument("--save")
p.add_argument("--resume")
p.add_argument("--omit", default="")
p.add_argument("--scaler", action="store_true")
p.add_argument("--workers", type=int, default=0)
p.add_argument("--adam", action="store_true")
p.add_argument("--numpy-noise", action="store_true")
p.add_argument("--python-noise", action="store_true")
p.add_argument("--epoch-batches", type=int, default=8)
p.add_argument("--batchnorm", action="store_true")
p.add_argument("--ema", action="store_true")
p.add_argument("--augment", choices=["drawn", "seeded"])
p.add_argument("--persistent", action="store_true")
args = p.parse_args()
omit = set(filter(None, args.omit.split(",")))

torch.manual_seed(0)
numpy.random.seed(0)
random.seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(8, 32), *([nn.BatchNorm1d(32)] if args.batchnorm else []),
                      nn.ReLU(), nn.Dropout(0.25), nn.Linear(32, 1))
opt = (torch.optim.Adam(model.parameters(), lr=0.01) if args.adam
       else torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
# Its LR is a function of its own step count, which only its state_dict() carries.
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 0.8 ** epoch)
# No overflow in these steps: the scale doubles at each, a state only its state_dict() carries.
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8, growth_interval=1) if args.scaler else None
data = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))
target = torch.randn(64, 1, generator=torch.Generator().manual_seed(2))
PER_EPOCH = args.epoch_batches
BATCH = 64 // PER_EPOCH


def batch(position):
    """The batch at this place of the data: an epoch's own permutation, in order."""
    epoch, k = divmod(position, PER_EPOCH)
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(100 + epoch))
    idx = perm[k * BATCH:(k + 1) * BATCH]
    return data[idx], target[idx]


start = 0
if args.resume:
    ck = torch.load(args.resume, weights_only=False)  # it holds NumPy's state
    if "model" not in omit:
        buffers = {name for name, _ in model.named_buffers()} if "buffers" in omit else set()
        model.load_state_dict({k: v for k, v in ck["model"].items() if k not in buffers},
                              strict=not buffers)
    if "optimizer" not in omit:
        opt.load_state_dict(ck["optimizer"])
    if "scheduler" in ck:
        sched.load_state_dict(ck["scheduler"])
    if "rng" in ck:
        torch.set_rng_state(ck["rng"])
    if "scaler" in ck:
        scaler.load_state_dict(ck["scaler"])
    if "numpy" in ck:
        numpy.random.set_state(ck["numpy"])
    if "random" in ck:
        random.setstate(ck["random"])
    start = ck["step"]
ema = [p.detach().clone() for p in model.parameters()] if args.ema else None
if ema and args.resume and "ema" in ck:
    for e, saved in zip(ema, ck["ema"]):
        e.copy_(saved)



class PlaceSampler(torch.utils.data.Sampler):
    """The batches' indices from a place of the data on, as batch() takes them; to the end of
    that place's epoch only when `one_epoch`."""

    def __init__(self, place, one_epoch=False):
        self.place, self.one_epoch = place, one_epoch

    def __iter__(self):
        end = (self.place // PER_EPOCH + 1) * PER_EPOCH if self.one_epoch else args.steps
        for position in range(self.place, min(end, args.steps)):
            epoch, k = divmod(position, PER_EPOCH)
            perm = torch.randperm(64, generator=torch.Generator().manual_seed(100 + epoch))
            yield perm[k * BATCH:(k + 1) * BATCH].tolist()


class Augmented(torch.utils.data.Dataset):
    """The samples with noise added, drawn per --augment."""

    def __len__(self):
        return len(data)

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(1000 + i) if args.augment == "seeded" else None
        return data[i] + 0.01 * torch.randn(8, generator=g), target[i]


def by_epoch(loader, sampler, place):
    """The batches of a loader iterated anew each epoch, from `place` on: its persistent
    workers live on across the epochs, their generators drawn on."""
    while place < args.steps:
        sampler.place = place
        yield from loader
        place = (place // PER_EPOCH + 1) * PER_EPOCH


loader = None
if args.workers:
    place = 0 if args.resume and "sampler" in omit else start
    sampler = PlaceSampler(place, one_epoch=args.persistent)
    # Its own generator for the workers' seeds: an iterator made after the global generator
    # was restored must not draw from it.
    loader = torch.utils.data.DataLoader(
        Augmented() if args.augment else torch.utils.data.TensorDataset(data, target),
        num_workers=args.workers, batch_sampler=sampler, persistent_workers=args.persistent,
        generator=torch.Generator().manual_seed(7))
    loader = by_epoch(loader, sampler, place) if args.persistent else iter(loader)

loss = None
for step in range(start, args.steps):
    if args.stop_at is not None and step == args.stop_at:
        ck = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}
        if "scheduler" not in omit:
            ck["scheduler"] = sched.state_dict()
        if "rng" not in omit:
            ck["rng"] = torch.get_rng_state()
        if scaler and "scaler" not in omit:
            ck["scaler"] = scaler.state_dict()
        if "numpy" not in omit:
            ck["numpy"] = numpy.random.get_state()
        if "random" not in omit:
            ck["random"] = random.getstate()
        if ema and "ema" not in omit:
            ck["ema"] = ema
        torch.save(ck, args.save)
        break
    # A loader without its place restarts from the epoch's first batch.
    position = step - start if args.resume and "sampler" in omit else step
    if args.resume and "epoch" in omit:  # the place in the epoch, in the first epoch's order
        position %= PER_EPOCH
    x, y = next(loader) if loader is not None else batch(position)
    if args.numpy_noise:  # an augmentation drawn from NumPy's generator
        x = x + torch.from_numpy(numpy.random.standard_normal(x.shape).astype("float32")) * 0.01
    if args.python_noise:  # a scale drawn from Python's
        x = x * (1 + 0.01 * random.random())
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    if scaler:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        opt.step()
    sched.step()
    if ema:
        with torch.no_grad():
            for e, p in zip(ema, model.parameters()):
                e.mul_(0.9).add_(p, alpha=0.1)
print(f"loss {loss.item() if loss is not None else None!r}")
