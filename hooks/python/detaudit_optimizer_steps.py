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
  the last one. Tracing runs where the code it traces runs, the first time: there an end closes
  its scope as it is traced.
- A step is taken to end after the graph it began before (torch.optim's step is one graph,
  between the graph breaks of `_use_grad`), unless its end is noted after a later graph.
- Notes of a trace dynamo restarted are dropped (the restart notes again). A graph compiled
  again (its guards failed: Adam's state appeared, a shape changed) is the same segment of the
  same frame, and takes the scopes the first one had.

Inside each step, eager or compiled, a label scope names the optimizer that steps:
`detaudit::optimizer_step <k> <Class> <tensors>`, k its place among the program's optimizers by
first step, so a report can say "step 8: the 1st of 2 optimizers, Adam over 7 tensors"
(src/trace/records.h reads it).

No node is added to any graph: what the program computes is unchanged.
"""
import sys
import threading
import weakref

from detaudit_after_import import after_import

_DYNAMO = "torch._dynamo"
_CALLS = ("call_function", "call_method", "call_module")
_comptime = None  # dynamo's comptime, once dynamo is imported: before that nothing is compiled
_trace_id = None  # torch._guards.CompileContext.current_trace_id
_thread = threading.local()  # .scopes: open step scopes; .pending: notes; .last: a _Graph
_segments = {}  # (frame, graph's index in its trace) -> (before, after) of the first graph there
_graphs_of_trace = {}  # trace -> graphs compiled in it so far
_LABEL = "detaudit::optimizer_step"
_ordinals = weakref.WeakKeyDictionary()  # optimizer -> its place by first step, from 1
_ordinals_lock = threading.Lock()
_optimizers_seen = 0  # a count, not len(_ordinals): an optimizer freed keeps its place
_is_compiling = None  # torch.compiler.is_compiling, where torch has it


class _Note:
    """A step's beginning (its mark's name) or end (mark None), as dynamo traced it."""

    def __init__(self, mark, graph, label=None):
        self.mark = mark
        self.label = label
        self.graph = weakref.ref(graph)
        self.ops_before = sum(1 for n in graph.nodes if n.op in _CALLS)
        self.trace = _current_trace()
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
    global _is_compiling
    _is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    pre(_step_begins)
    post(_step_ends)


def _step_begins(optimizer, args, kwargs):
    if _comptime is not None:
        _comptime(_note_begin)
    if not _compiling():
        _open_label(_label_of(optimizer))


def _step_ends(optimizer, args, kwargs):
    if _comptime is not None:
        _comptime(_note_end)
    if not _compiling():
        _close_label()


def _compiling():
    # True, a constant, while dynamo traces the hooks: the graph's wrapper opens the label then.
    return _is_compiling is not None and _is_compiling()


def _label_of(optimizer):
    global _optimizers_seen
    with _ordinals_lock:
        ordinal = _ordinals.get(optimizer)
        if ordinal is None:
            _optimizers_seen += 1
            ordinal = _ordinals[optimizer] = _optimizers_seen
    tensors = sum(len(group["params"]) for group in optimizer.param_groups)
    return f"{_LABEL} {ordinal} {type(optimizer).__name__} {tensors}"


def _open_label(label):
    import torch

    _close_label()  # a step that raised left its label open
    _thread.label = torch._C._autograd._record_function_with_args_enter(label)


def _close_label():
    import torch

    label = getattr(_thread, "label", None)
    if label is not None:
        _thread.label = None
        torch._C._autograd._record_function_with_args_exit(label)


def _note_begin(ctx):
    name, label = "Optimizer", None
    try:
        optimizer = ctx.get_local("optimizer")
        name = optimizer.python_type().__name__
        # The optimizer itself, which its VariableTracker holds (comptime's way to reach it).
        label = _label_of(optimizer._i_will_not_complain_if_bc_breaks_VariableTracker().value)
    except Exception:  # a torch whose comptime cannot say: the mark is named all the same
        pass
    note = _Note(f"Optimizer.step#{name}.step", ctx.graph(), label)
    pending = _pending(note.trace)
    if pending and pending[-1].mark:
        pending[-1] = note  # one step, noted twice: the last stands
    else:
        pending.append(note)


def _note_end(ctx):
    # After the last graph compiled, and so done now; or after its own graph, if ops precede it
    # there (moved when that graph is compiled).
    note = _Note(None, ctx.graph())
    _pending(note.trace).append(note)
    last = getattr(_thread, "last", None)
    opened = getattr(_thread, "opened", None)
    _thread.opened = None
    if opened is not None and opened[0] is last:
        return  # the end its beginning's graph holds already
    if opened is not None:
        opened[0].after.remove(opened[1])  # the step runs on over more graphs: it ends here
    if last is not None:
        last.after.append(note)  # which ran already: done now, and from its next run on
    _close()


def _wrap_compiled_graphs(dynamo):
    """Once the package is whole: its modules import one another as it loads."""
    global _comptime, _trace_id
    cls = getattr(sys.modules.get(_DYNAMO + ".output_graph"), "OutputGraph", None)
    compile_graph = cls and cls.__dict__.get("call_user_compiler")
    comptime = getattr(sys.modules.get(_DYNAMO + ".comptime"), "comptime", None)
    context = getattr(sys.modules.get("torch._guards"), "CompileContext", None)
    trace_id = getattr(context, "current_trace_id", None)
    if compile_graph is None or comptime is None or trace_id is None or \
            getattr(compile_graph, "_detaudit", False):
        return  # another dynamo's layout: compiled steps stay unmarked, and the run says so

    def call_user_compiler(self, gm, *args, **kwargs):
        graph = _Graph(compile_graph(self, gm, *args, **kwargs))
        _place_notes(graph, (self.graph, gm.graph), sum(1 for n in gm.graph.nodes if n.op in _CALLS))
        return graph

    call_user_compiler._detaudit = True
    cls.call_user_compiler = call_user_compiler
    _trace_id = trace_id
    _comptime = comptime


def _current_trace():
    """(frame, compile, attempt) of the trace dynamo is in, or None."""
    try:
        t = _trace_id()
        return (t.compile_id.frame_id, t.compile_id.frame_compile_id, t.attempt)
    except Exception:
        return None


def _pending(trace):
    """This thread's notes not yet placed, less those of a trace dynamo restarted since."""
    pending = _stack("pending")
    if trace is not None:
        pending[:] = [n for n in pending if n.trace is None or n.trace[:2] != trace[:2] or
                      n.trace[2] >= trace[2]]
    return pending


def _place_notes(graph, fx_graphs, ops):
    """The notes traced since the last graph compiled, placed around this one, which is about to
    run for the first time; or, for a graph compiled again, the scopes of the first."""
    trace = _current_trace()
    pending, kept = _pending(trace), []
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
            # Opened as it first runs, not here inside dynamo's scopes; and closed after it.
            # torch.optim's step is one graph between the graph breaks of _use_grad; and its end
            # is noted only where dynamo traces again, not for another optimizer's step through
            # the wrapper frames it compiled already.
            end = _Note(None, fx_graphs[-1])
            graph.before.append(note)
            graph.after.append(end)
            _thread.opened = (graph, end)
    pending[:] = kept
    _thread.last = graph
    if trace is not None:
        index = _graphs_of_trace[trace] = _graphs_of_trace.get(trace, 0) + 1
        segment = (trace[0], index)
        first = _segments.setdefault(segment, (graph.before, graph.after))
        if not graph.before and not graph.after:
            graph.before, graph.after = first


def _apply(notes):
    for note in notes:
        if note.done_once:
            note.done_once = False
        elif note.mark:
            _enter(note.mark, note.label)
        else:
            _close()


def _stack(name):
    stack = getattr(_thread, name, None)
    if stack is None:
        stack = []
        setattr(_thread, name, stack)
    return stack


def _enter(name, label=None):
    import torch

    _close()  # a step left open ends where the next one begins
    _stack("scopes").append(torch._C._autograd._record_function_with_args_enter(name))
    if label:
        _open_label(label)


def _close():
    import torch

    scopes = _stack("scopes")
    if scopes:
        _close_label()
        torch._C._autograd._record_function_with_args_exit(scopes.pop())
