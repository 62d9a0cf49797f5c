"""Optimizer steps kept visible where torch.compile drops their mark.

The recorder counts steps and tells the optimizer phase by the `Optimizer.step#<Class>.step`
profiler scope each torch.optim optimizer opens around its step. Dynamo ignores profiler scopes in
the code it compiles ("Profiler record function ... will be ignored"), so a compiled
`opt.step()` (PyTorch's "compile the optimizer" recipe) or a compiled training step would run
with no mark: every step numbered 0, no op in the optimizer phase, nothing for a sentinel to
compare. Here the same scope is opened from outside the compiled graphs, which stay as they are:

- A global optimizer step pre-hook and post-hook call `comptime`, which dynamo runs while it
  traces and which does nothing in eager code (torch's own scope is there). At trace time they
  note where a step begins or ends: in which FX graph, after how many of its ops.
- Each graph dynamo compiles runs inside a wrapper (`OutputGraph.call_user_compiler`'s result)
  that opens the scope of a step beginning before it and closes the scope of a step ending
  after it. torch.optim's own graph breaks (`_use_grad`) put the hooks in graphs of no op, which
  dynamo does not compile: a beginning then goes before the next graph compiled, an end after
  the last one. Tracing runs where the code it traces runs, the first time: there the scopes
  open and close as the notes are placed.

No node is added to any graph: what the program computes is unchanged.
"""
import sys
import threading
import weakref

from detaudit_after_import import after_import

_DYNAMO = "torch._dynamo"
_CALLS = ("call_function", "call_method", "call_module")
_comptime = None  # dynamo's comptime, once dynamo is imported: before that nothing is compiled
_thread = threading.local()  # .scopes: open step scopes; .pending: notes; .last: a _Graph


class _Note:
    """A step's beginning (its mark's name) or end (mark None), as dynamo traced it."""

    def __init__(self, mark, graph):
        self.mark = mark
        self.graph = weakref.ref(graph)
        self.ops_before = sum(1 for n in graph.nodes if n.op in _CALLS)
        self.done_once = False  # done as it was placed: not again in the graph's first run


class _Graph:
    """A compiled graph's function, with the step scopes that open before and close after it."""

    def __init__(self, compiled):
        self.compiled = compiled
        self.before, self.after = [], []

    def __call__(self, *args, **kwargs):
        if self.before:
            _apply(self.before)
        try:
            return self.compiled(*args, **kwargs)
        finally:
            if self.after:
                _apply(self.after)


def install():
    """The hooks once torch is imported, the graph wrapping once dynamo is (now, if they are)."""
    if "torch" in sys.modules:
        _register_hooks(sys.modules["torch"])
    else:
        after_import("torch", _register_hooks)
    if _DYNAMO in sys.modules:
        _wrap_compiled_graphs(sys.modules[_DYNAMO])
    else:
        after_import(_DYNAMO, _wrap_compiled_graphs)


def _register_hooks(torch):
    optimizer = sys.modules.get("torch.optim.optimizer")  # torch.optim deletes the name
    pre = getattr(optimizer, "register_optimizer_step_pre_hook", None)
    post = getattr(optimizer, "register_optimizer_step_post_hook", None)
    if pre is None or post is None:
        return  # torch 1.13: no global step hooks, and no torch.compile either
    pre(_step_begins)
    post(_step_ends)


def _step_begins(optimizer, args, kwargs):
    if _comptime is not None:
        _comptime(_note_begin)


def _step_ends(optimizer, args, kwargs):
    if _comptime is not None:
        _comptime(_note_end)


def _note_begin(ctx):
    try:
        name = ctx.get_local("optimizer").python_type().__name__
    except Exception:  # a torch whose comptime cannot say: the mark is named all the same
        name = "Optimizer"
    pending = _stack("pending")
    note = _Note(f"Optimizer.step#{name}.step", ctx.graph())
    # A restarted trace notes the same beginning again: the last one stands.
    if pending and pending[-1].mark:
        pending[-1] = note
    else:
        pending.append(note)


def _note_end(ctx):
    # After the last graph compiled, and so done now; or after its own graph, if ops precede it
    # there (moved when that graph is compiled).
    note = _Note(None, ctx.graph())
    _stack("pending").append(note)
    last = getattr(_thread, "last", None)
    if last is not None:
        last.after.append(note)  # which ran already: done now, and from its next run on
    _close()


def _wrap_compiled_graphs(dynamo):
    """Once the package is whole: its modules import one another as it loads."""
    global _comptime
    cls = getattr(sys.modules.get(_DYNAMO + ".output_graph"), "OutputGraph", None)
    compile_graph = cls and cls.__dict__.get("call_user_compiler")
    comptime = getattr(sys.modules.get(_DYNAMO + ".comptime"), "comptime", None)
    if compile_graph is None or comptime is None or getattr(compile_graph, "_detaudit", False):
        return  # another dynamo's layout: compiled steps stay unmarked, and the run says so

    def call_user_compiler(self, gm, *args, **kwargs):
        graph = _Graph(compile_graph(self, gm, *args, **kwargs))
        _place_notes(graph, (self.graph, gm.graph), sum(1 for n in gm.graph.nodes if n.op in _CALLS))
        return graph

    call_user_compiler._detaudit = True
    cls.call_user_compiler = call_user_compiler
    _comptime = comptime


def _place_notes(graph, fx_graphs, ops):
    """The notes traced since the last graph compiled, placed around this one, which is about to
    run for the first time."""
    pending, kept = _stack("pending"), []
    last = getattr(_thread, "last", None)
    for note in pending:
        own = note.graph() is not None and any(note.graph() is g for g in fx_graphs)
        if note.mark is None:
            if own and note.ops_before > 0:  # it ends after this graph's ops
                if last is not None and note in last.after:
                    last.after.remove(note)
                graph.after.append(note)
                note.done_once = True  # closed as traced, before this graph's first run
        elif own and ops > 0 and note.ops_before == ops:
            kept.append(note)  # it begins after all of this graph's ops: before the next one
        else:
            graph.before.append(note)
            _enter(note.mark)
            note.done_once = True
    pending[:] = kept
    _thread.last = graph


def _apply(notes):
    for note in notes:
        if note.done_once:
            note.done_once = False
        elif note.mark:
            _enter(note.mark)
        else:
            _close()


def _stack(name):
    stack = getattr(_thread, name, None)
    if stack is None:
        stack = []
        setattr(_thread, name, stack)
    return stack


def _enter(name):
    import torch

    _close()  # a step left open ends where the next one begins
    _stack("scopes").append(torch._C._autograd._record_function_with_args_enter(name))


def _close():
    import torch

    scopes = _stack("scopes")
    if scopes:
        torch._C._autograd._record_function_with_args_exit(scopes.pop())
