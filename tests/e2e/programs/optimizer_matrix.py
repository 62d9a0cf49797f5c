"""Every torch.optim optimizer, in each implementation this torch has on the CPU (single-tensor,
foreach, fused), trained a few steps each, one after the other in one process: the detector
recall matrix of tests/e2e/test_optimizer_matrix.py.

    python optimizer_matrix.py [--steps 4] [--plant-step 2] [--plant-run run-1] [--cells a,b]

Each cell is a small MLP seeded afresh, so cells are independent: a difference made in one
cell stays in that cell's steps. In the run whose run directory (DETAUDIT_RUN_DIR) ends in
--plant-run, one gradient element is scaled by 1.001 at the cell's step --plant-step, by the
same op every run runs (a `mul_` whose factor is 1.0 in the other runs). Prints one line per
cell, `cell NAME steps FIRST-LAST planted STEP` (global step numbers, counted as detaudit
counts them: one per optimizer step) or `cell NAME skipped: WHY`, then a checksum of each cell's
final parameters.
"""
import argparse
import hashlib
import inspect
import os

import torch

OPTIMIZERS = [
    ("sgd", lambda p, **k: torch.optim.SGD(p, lr=0.05, **k)),
    ("sgd-momentum", lambda p, **k: torch.optim.SGD(p, lr=0.05, momentum=0.9, **k)),
    ("adam", lambda p, **k: torch.optim.Adam(p, lr=1e-2, **k)),
    ("adamw", lambda p, **k: torch.optim.AdamW(p, lr=1e-2, **k)),
    ("adagrad", lambda p, **k: torch.optim.Adagrad(p, lr=1e-2, **k)),
    ("rmsprop", lambda p, **k: torch.optim.RMSprop(p, lr=1e-2, **k)),
    ("adamax", lambda p, **k: torch.optim.Adamax(p, lr=1e-2, **k)),
    ("nadam", lambda p, **k: torch.optim.NAdam(p, lr=1e-2, **k)),
    ("radam", lambda p, **k: torch.optim.RAdam(p, lr=1e-2, **k)),
    ("adadelta", lambda p, **k: torch.optim.Adadelta(p, lr=1.0, **k)),
    ("asgd", lambda p, **k: torch.optim.ASGD(p, lr=1e-2, **k)),
]
IMPLEMENTATIONS = [("single", {"foreach": False}), ("foreach", {"foreach": True}),
                   ("fused", {"fused": True})]
# clip_grad_norm_'s foreach norms, where this torch has them (2.0 on).
CLIP_FOREACH = ({"foreach": True}
                if "foreach" in inspect.signature(torch.nn.utils.clip_grad_norm_).parameters else {})
# Training loops' other writers of parameters and gradients, each around foreach AdamW.
EXTRAS = ["lbfgs", "grad-scaler", "clip-grad-norm", "ema-lerp", "lr-scheduler"]


def ema_update(ema, params):
    """An EMA of the weights, as training loops keep one: _foreach_lerp_ (torch 2.x)."""
    if hasattr(torch, "_foreach_lerp_"):
        torch._foreach_lerp_(ema, params, 0.1)
    else:
        torch._foreach_mul_(ema, 0.9)
        torch._foreach_add_(ema, params, alpha=0.1)


def model():
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def cells():
    for name, make in OPTIMIZERS:
        for impl, kwargs in IMPLEMENTATIONS:
            yield f"{name}/{impl}", make, kwargs, None
    for extra in EXTRAS:
        yield extra, None, None, extra


def build(make, kwargs, extra, params):
    """The cell's optimizer, or the reason this torch cannot make it on the CPU."""
    if extra == "lbfgs":
        return torch.optim.LBFGS(params, lr=0.5, max_iter=3)
    if extra is not None:
        return torch.optim.AdamW(params, lr=1e-2, foreach=True)
    try:
        return make(params, **kwargs)
    except (TypeError, RuntimeError, ValueError) as e:  # no such implementation in this torch
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--plant-step", type=int, default=2)
    ap.add_argument("--plant-run", default="run-1")
    ap.add_argument("--cells", default="")
    args = ap.parse_args()
    wanted = set(args.cells.split(",")) if args.cells else None
    run = os.path.basename(os.environ.get("DETAUDIT_RUN_DIR", "").rstrip("/"))
    planting = run == args.plant_run
    torch.set_num_threads(1)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1))
    y = torch.randn(32, 4, generator=torch.Generator().manual_seed(2))
    step = 0  # detaudit's step: one per optimizer step, over all cells
    sums = []
    for index, (name, make, kwargs, extra) in enumerate(cells()):
        if wanted is not None and name not in wanted:
            continue
        if extra == "grad-scaler" and not hasattr(getattr(torch, "amp", None), "GradScaler"):
            print(f"cell {name} skipped: torch {torch.__version__} has no CPU GradScaler")
            continue
        torch.manual_seed(100 + index)
        net = model()
        opt = build(make, kwargs, extra, net.parameters())
        if isinstance(opt, str):
            print(f"cell {name} skipped: {opt}")
            continue
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0) if extra == "grad-scaler" else None
        ema = [p.detach().clone() for p in net.parameters()] if extra == "ema-lerp" else None
        sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.5) if extra == "lr-scheduler" else None
        first = step
        for k in range(args.steps):
            factor = 1.001 if planting and k == args.plant_step else 1.0

            def closure():
                opt.zero_grad()
                loss = torch.nn.functional.mse_loss(net(x), y)
                (scaler.scale(loss) if scaler else loss).backward()
                # The plant: one gradient element, by the same op in every run.
                net[0].weight.grad.view(-1)[3:4].mul_(factor)
                return loss

            if extra == "lbfgs":
                opt.step(closure)
            else:
                closure()
                if scaler:
                    scaler.unscale_(opt)
                if extra == "clip-grad-norm":
                    torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5, **CLIP_FOREACH)
                if ema is not None:
                    # Before the step: after it, its ops would count in the next step, the
                    # next cell's first.
                    ema_update(ema, [p.detach() for p in net.parameters()])
                if scaler:
                    scaler.step(opt)
                    scaler.update()
                else:
                    opt.step()
                if sched:
                    sched.step()
            step += 1
        print(f"cell {name} steps {first}-{step - 1} planted {first + args.plant_step}", flush=True)
        h = hashlib.sha256()
        for p in list(net.parameters()) + (ema or []):
            h.update(p.detach().numpy().tobytes())
        sums.append(f"{name} {h.hexdigest()[:16]}")
    for s in sums:
        print("params " + s)


if __name__ == "__main__":
    main()
