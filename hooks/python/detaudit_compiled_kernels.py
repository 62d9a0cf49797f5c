"""The kernels torch.compile's inductor generates, made visible to the recorder.

Inductor runs its kernels from a Python module it writes (`call(args)`), below the dispatcher:
the interposer sees the compiled region and its extern kernels (`mm`), never the generated C++
(CPU) or Triton (CUDA) kernels. When inductor loads such a module, each kernel in it is
replaced by a call of a dispatcher op of the same name, `inductor_kernel::<kernel>`, whose
implementation runs the kernel: the recorder records it like any op, its inputs when it starts
and its outputs when it ends, in the compiled region's place.

  inductor_kernel::<kernel>(str origin, Tensor[] inputs) -> Tensor(a!)[]

`origin` names the aten ops the kernel was generated from (inductor builds kernel names from
them) and says whether its code adds with atomics: "aten::index_put, aten::mul; atomic adds".
`inputs` are the buffers the kernel only reads (in_ptr), the returned tensors those it writes
(out_ptr, in_out_ptr). An in_out buffer is not an input: inductor also uses one for a result it
writes and then updates (a mean: the sum, then the division), whose bytes before the kernel are
whatever the allocator left there. The returns are declared written (`Tensor(a!)[]`): a kernel
often writes a buffer it also reads (an optimizer's parameter), and torch refuses an op
declared functional whose output is its input (an error where CI is set, a warning elsewhere).
"""
import contextlib
import re
import sys
import threading

from detaudit_after_import import after_import

NAMESPACE = "inductor_kernel"
_CODECACHE = "torch._inductor.codecache"
# `NAME = async_compile.cpp_pybinding([argtypes], r'''source''')` and
# `NAME = async_compile.triton('NAME', '''source''', ...)` in inductor's output code.
_CPP = re.compile(r"^(\w+) = async_compile\.cpp_pybinding\(\[[^\]]*\], r?'''(.*?)'''", re.M | re.S)
_TRITON = re.compile(r"^(\w+) = async_compile\.triton\('\w+', r?'''(.*?)'''", re.M | re.S)
_PARAM = re.compile(r"^(in_out_ptr|in_ptr|out_ptr)\d+$")

_state = threading.local()  # the kernel call the op's implementation is to run
_ops = {}
_library = None


def install():
    """Patches inductor's code cache when it is imported (now, if it already is)."""
    if _CODECACHE in sys.modules:
        _patch(sys.modules[_CODECACHE])
    else:
        after_import(_CODECACHE, _patch)


def _patch(codecache):
    cache = getattr(codecache, "PyCodeCache", None)
    load = cache and cache.__dict__.get("load_by_key_path")
    if not isinstance(load, classmethod) or getattr(load.__func__, "_detaudit", False):
        return  # another torch's layout: the regions stay opaque, as before

    def load_by_key_path(cls, *args, **kwargs):
        module = load.__func__(cls, *args, **kwargs)
        try:
            _wrap_kernels(module)
        except Exception as e:  # never break the program's compile
            print(f"detaudit: compiled kernels of {getattr(module, '__file__', '?')} are not "
                  f"recorded: {type(e).__name__}: {e}", file=sys.stderr)
        return module

    load_by_key_path._detaudit = True
    cache.load_by_key_path = classmethod(load_by_key_path)


def _wrap_kernels(module):
    if getattr(module, "_detaudit_wrapped", False):
        return  # the cache hands the same module out again
    module._detaudit_wrapped = True
    path = getattr(module, "__file__", None)
    if not path:
        return
    with open(path) as f:
        code = f.read()
    for name, source in _CPP.findall(code):
        fn = module.__dict__.get(name)
        roles = _roles(source, r"kernel\s*\(([^)]*)\)", r"(\w+)\s*$")
        if callable(fn) and roles:
            module.__dict__[name] = _cpp_kernel(name, fn, roles, _origin(name, source))
    for name, source in _TRITON.findall(code):
        kernel = module.__dict__.get(name)
        roles = _roles(source, r"def \w+\(([^)]*)\)", r"(\w+)\s*(?::.*)?$")
        if hasattr(kernel, "run") and roles:
            kernel.run = _triton_run(name, kernel.run, roles, _origin(name, source))


def _roles(source, signature, param):
    """Each parameter's role ("in", "in_out", "out", or None for a scalar), in order."""
    m = re.search(signature, source)
    if not m:
        return None
    roles = []
    for p in m.group(1).split(","):
        name = re.search(param, p.strip())
        kind = _PARAM.match(name.group(1)) if name else None
        roles.append(kind.group(1).replace("_ptr", "") if kind else None)
    return roles


def _origin(name, source):
    """The aten ops a kernel's name was built from (inductor's descriptive names: its fused
    ops' aten names, sorted and joined by "_"), and whether its code adds with atomics."""
    import torch

    body = re.sub(r"^(cpp|triton)_(poi|red|per|tem|)_?(fused_)?", "", name)
    body = re.sub(r"_\d+$", "", body)
    words, ops, i = body.split("_"), [], 0
    while i < len(words):  # the longest run of words that is an aten op, from the left
        for j in range(len(words), i, -1):
            candidate = "_".join(words[i:j])
            if hasattr(torch.ops.aten, candidate):
                ops.append("aten::" + candidate)
                i = j
                break
        else:
            i += 1
    atomic = "atomic_add" in source
    return ", ".join(ops) + ("; atomic adds" if atomic else "")


def _op(name):
    op = _ops.get(name)
    if op is None:
        import torch

        global _library
        if _library is None:
            _library = torch.library.Library(NAMESPACE, "FRAGMENT")
        _library.define(f"{name}(str origin, Tensor[] inputs) -> Tensor(a!)[]")
        _library.impl(name, _run, "CompositeExplicitAutograd")
        op = _ops[name] = getattr(getattr(torch.ops, NAMESPACE), name)
    return op


def _run(origin, inputs):
    run, outputs = _state.call
    _state.call = None
    run()
    return outputs


def _split(args, roles):
    import torch

    inputs, outputs = [], []
    for arg, role in zip(args, roles):
        if not isinstance(arg, torch.Tensor):
            continue
        if role == "in":
            inputs.append(arg)
        if role in ("out", "in_out"):
            outputs.append(arg)
    return inputs, outputs


@contextlib.contextmanager
def _plain_call():
    """No autograd node, and the op called once: under the Python dispatcher (on in compiled
    code) a Python kernel is dispatched twice, and would be recorded twice."""
    import torch

    no_python_dispatcher = getattr(torch._C, "_DisablePythonDispatcher", contextlib.nullcontext)
    with torch.no_grad(), no_python_dispatcher():
        yield


def _cpp_kernel(name, fn, roles, origin):
    op = _op(name)

    def kernel(*args):
        inputs, outputs = _split(args, roles)
        _state.call = (lambda: fn(*args), outputs)
        with _plain_call():
            op(origin, inputs)

    kernel.__name__ = name
    return kernel


def _triton_run(name, run, roles, origin):
    op = _op(name)

    def kernel_run(*args, **kwargs):
        inputs, outputs = _split(args, roles)
        result = []
        _state.call = (lambda: result.append(run(*args, **kwargs)), outputs)
        with _plain_call():
            op(origin, inputs)
        return result[0] if result else None

    return kernel_run
