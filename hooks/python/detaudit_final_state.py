"""What a run leaves, for `detaudit run --validate`: at exit, the parameters and state of every
torch.optim optimizer that stepped, hashed, into DETAUDIT_FINAL_STATE/final-state.r<rank>.json.
The validate runs record no op; two of them that leave different state diverge where no observer
looked. A global step hook keeps each optimizer until exit (a training loop's locals are gone by
then): its memory is held longer, nothing it computes changes.

Bytes are read with ctypes (no NumPy: a CUDA venv may have none), on the CPU, after the program's
own work: nothing it computes changes.
"""
import atexit
import ctypes
import hashlib
import json
import os
import sys

from detaudit_after_import import after_import

_optimizers = []  # in order of first step

def _tensor_digest(t):
    t = t.detach().cpu().contiguous()
    return hashlib.sha256(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())).hexdigest()


def _optimizer_state(opt, torch):
    tensors = []
    for g, group in enumerate(opt.param_groups):
        for i, p in enumerate(group["params"]):
            name = f"{type(opt).__name__}.param_groups[{g}].params[{i}]"
            tensors.append({"name": name, "shape": list(p.shape), "sha256": _tensor_digest(p)})
            for key in sorted(opt.state.get(p, {}), key=str):
                v = opt.state[p][key]
                if isinstance(v, torch.Tensor):
                    tensors.append({"name": f"{name}.state[{key}]", "shape": list(v.shape),
                                    "sha256": _tensor_digest(v)})
    return tensors


def _write(directory):
    torch = sys.modules.get("torch")
    optimizers = list(_optimizers) if torch else []
    tensors = []
    for k, opt in enumerate(optimizers):
        for t in _optimizer_state(opt, torch):
            t["name"] = f"optimizer {k} {t['name']}"
            tensors.append(t)
    rank = os.environ.get("RANK", "0")
    path = os.path.join(directory, f"final-state.r{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"rank": int(rank), "optimizers": len(optimizers), "tensors": tensors}, f)
    os.replace(path + ".tmp", path)


def install():
    directory = os.environ.get("DETAUDIT_FINAL_STATE")
    if not directory:
        return

    seen = set()

    def after_step(opt, args, kwargs):
        if id(opt) not in seen:
            seen.add(id(opt))
            _optimizers.append(opt)

    def register(torch):
        import importlib

        module = importlib.import_module("torch.optim.optimizer")
        register_hook = getattr(module, "register_optimizer_step_post_hook", None)
        if register_hook:  # torch 2.x; a 1.x run leaves no state, and validate says so
            register_hook(after_step)

    after_import("torch", register)

    def at_exit():
        try:
            _write(directory)
        except Exception as e:  # the program's exit is its own: said, never raised
            print(f"detaudit: warning: the final state was not hashed: {e}")

    atexit.register(at_exit)
