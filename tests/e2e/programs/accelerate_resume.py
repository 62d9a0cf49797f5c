"""A loop of one's own under Hugging Face accelerate, stopped and resumed with its
save_state/load_state, as its docs show (tests/e2e/test_resume.py): an MLP with dropout, AdamW,
a step scheduler, a shuffled DataLoader of 4 batches an epoch, all through
`accelerator.prepare`, on the CPU.

    accelerate_resume.py [--steps 8] [--stop-at K --save DIR | --resume DIR] [--omit WHAT]

--stop-at K saves the state before step K (`accelerator.save_state(DIR)`) and stops; --resume
loads it (`accelerator.load_state(DIR)`) and skips the batches of the epoch already trained
(`accelerator.skip_first_batches`). --omit leaves out, one at a time, what users leave out:
"scheduler" is made but not passed to prepare (save_state does not know it), "skip" resumes
the epoch from its first batch, "epoch" does not tell the resumed loader its epoch
(`set_epoch`), which it then counts from 0, "generator" makes the loader without a generator of
its own (its iterators draw their seeds from torch's: the resumed process draws once more before
its first step). Prints the last loss.
"""
import argparse

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--stop-at", type=int)
p.add_argument("--save")
p.add_argument("--resume")
p.add_argument("--omit", default="")
args = p.parse_args()
omit = set(filter(None, args.omit.split(",")))

set_seed(0)
torch.set_num_threads(1)
# A seedable sampler: each epoch's order from the seed and the epoch, so that a loader resumed
# mid-epoch takes that epoch's order again (accelerate's advice for reproducible resumes).
accelerator = Accelerator(cpu=True,
                          dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.25), nn.Linear(32, 1))
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 0.8 ** epoch)
data = torch.utils.data.TensorDataset(torch.randn(32, 8, generator=torch.Generator().manual_seed(1)),
                                      torch.randn(32, 1, generator=torch.Generator().manual_seed(2)))
# Its own generator: each iterator made draws a seed from the loader's generator, torch's
# global one unless given one, and a resumed process makes one more than the run through made
# by then ("generator" left out).
loader = torch.utils.data.DataLoader(
    data, batch_size=8, shuffle=True,
    generator=None if "generator" in omit else torch.Generator().manual_seed(3))
if "scheduler" in omit:
    model, opt, loader = accelerator.prepare(model, opt, loader)
else:
    model, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
PER_EPOCH = len(loader)

start = 0
if args.resume:
    accelerator.load_state(args.resume)
    start = int(opt.state_dict()["state"][0]["step"])  # AdamW's count: the steps trained

loss = None
step = start
for epoch in range(start // PER_EPOCH, (args.steps + PER_EPOCH - 1) // PER_EPOCH):
    if not (args.resume and "epoch" in omit):
        # A loader made anew counts its epochs from 0: the seedable sampler's order is the
        # epoch's only when told it.
        loader.set_epoch(epoch)
    batches = loader
    if args.resume and epoch == start // PER_EPOCH and "skip" not in omit:
        batches = accelerator.skip_first_batches(loader, start % PER_EPOCH)
    for x, y in batches:
        if step >= args.steps:
            break
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        accelerator.backward(loss)
        opt.step()
        sched.step()
        step += 1
        if step == args.stop_at:  # saved after step K-1, before the next batch is drawn
            accelerator.save_state(args.save)
            raise SystemExit(0)
print(f"loss {loss.item() if loss is not None else None!r}")
