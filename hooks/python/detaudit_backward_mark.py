"""The loss, shown to the sentinel (`run --sentinel`) without its ops: each call of
torch.autograd.backward (Tensor.backward's too) runs inside a user-scope RecordFunction,
`detaudit::backward`, whose input is the tensor it starts from. In a lean sentinel step the
recorder sees user scopes only until the optimizer runs, and takes the step's loss from this mark
(hooks/recorder). The mark is a RecordFunction, not an op: nothing the program computes changes,
and a full recording's trace is the same with it. Installed only for a sentinel."""
import functools
import json
import os
import sys

_NAME = "detaudit::backward"


def wanted():
    """The run's config (DETAUDIT_CONFIG) asks for a sentinel."""
    try:
        with open(os.environ["DETAUDIT_CONFIG"]) as f:
            return bool(json.load(f).get("record", {}).get("sentinel"))
    except (KeyError, OSError, ValueError, AttributeError):
        return False


def install():
    """Wraps torch.autograd.backward once torch is imported (now, if it already is)."""
    if "torch" in sys.modules:
        _patch(sys.modules["torch"])
    else:
        from detaudit_after_import import after_import

        after_import("torch", _patch)


def _patch(torch):
    autograd_c = getattr(torch._C, "_autograd", None)
    enter = getattr(autograd_c, "_record_function_with_args_enter", None)
    leave = getattr(autograd_c, "_record_function_with_args_exit", None)
    backward = getattr(torch.autograd, "backward", None)
    if enter is None or leave is None or backward is None or hasattr(backward, "_detaudit"):
        return

    @functools.wraps(backward)
    def marked_backward(tensors, *args, **kwargs):
        first = tensors[0] if isinstance(tensors, (list, tuple)) and tensors else tensors
        handle = enter(_NAME, first) if isinstance(first, torch.Tensor) else enter(_NAME)
        try:
            return backward(tensors, *args, **kwargs)
        finally:
            leave(handle)

    marked_backward._detaudit = True
    torch.autograd.backward = marked_backward
