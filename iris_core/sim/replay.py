"""Replaying a kernel's tile operations without Triton's front end.

The interpreter runs a kernel's Python once per program and launch, and most of that time is
Triton's front end (types, promotion, broadcasting: a few dozen Python calls per `a + b`), not
the tile operations, which its builder does with numpy. For most kernels the front end's work
is the same at every launch: it depends on the arguments' types, the constexprs and nothing
else, so the builder sees the same operations in the same order, only on other data.

`Recorder` watches one program of a launch and keeps the builder's operations in order, each
with where its operands come from (an argument, or an earlier operation's result); the
`Program` it makes runs them again, at later launches, on their arguments. A program is kept
only when nothing in the run depended on the data: a recording is given up as soon as Python
reads a value (`if`, `while` or `range` over a tensor: a flag wait, a loop bounded by an
argument), a value is made outside the builder (the interpreter's reductions and scans, in
numpy), or something only the host does runs (reading the clock, sleeping, Python's print).
Those kernels keep running under the interpreter, as before.

The simulator's own checks inside kernels (iris_core.sim.checks.check_access, which refuses
an access outside the heap) are recorded as steps of the program (`host_step`), and run again
at every replay on that launch's values. Replays need no language patches and run only
without the race detector and with debug off (the detector watches the front end's accesses,
and device assertions are raised through it).
"""

from __future__ import annotations

import builtins
import os
import threading

ENABLED = os.environ.get("IRIS_SIM_REPLAY", "1") != "0"

_MAX_STEPS = 200_000  # longer programs (a long unrolled loop) are not kept
# builder operations whose result is not a function of their operands alone (memory, the grid, effects)
_IMPURE = ("load", "store", "atomic", "program", "print", "assert", "barrier", "descriptor", "inline_asm",
           "extern", "histogram")


class _Slot:
    """An operand of a recorded step: the value in slot `index`."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


class _Tensor:
    """An operand of a host step: a language tensor of `type` over the value in slot `index`."""

    __slots__ = ("index", "type")

    def __init__(self, index: int, type):
        self.index, self.type = index, type


class _Sequence:
    """An operand that is a list or tuple holding recorded values."""

    __slots__ = ("kind", "items")

    def __init__(self, kind, items):
        self.kind, self.items = kind, items


class Source:
    """Writes a recorded program as the source of one Python function: its operands by name
    (slots as locals, everything else as the function's globals)."""

    def __init__(self, constants: dict):
        self.constants = constants
        self.names: dict = {}  # id -> (name, object): the function's globals (functions, constant operands)

    def global_name(self, obj) -> str:
        if id(obj) not in self.names:
            self.names[id(obj)] = (f"g{len(self.names)}", obj)
        return self.names[id(obj)][0]

    def operand(self, x) -> str:
        cls = x.__class__
        if cls is _Slot:
            return self.global_name(self.constants[x.index]) if x.index in self.constants else f"v{x.index}"
        if cls is _Tensor:
            return f"T({self.operand(_Slot(x.index))}, {self.global_name(x.type)})"
        if cls is _Sequence:
            items = "".join(f"{self.operand(item)}, " for item in x.items)
            return f"[{items}]" if x.kind is list else f"({items})"
        return self.global_name(x)

    @staticmethod
    def assign(call: str, result) -> list[str]:
        """The lines that make `call`'s result (and its items) the slots of `result`."""
        if result is None:
            return [f"    {call}"]
        slot, items = result
        return [f"    v{slot} = {call}"] + [f"    v{slot + j} = v{slot}[{j - 1}]" for j in range(1, items + 1)]

    def compile(self, lines: list[str]) -> tuple[str, object]:
        lines.append("    return None")
        source = "\n".join(lines)
        scope = {name: obj for name, obj in self.names.values()}
        exec(compile(source, "<iris_core.sim.replay>", "exec"), scope)
        return source, scope["run"]


class Program:
    """A kernel's recorded tile operations, made into one Python function (a call per
    operation) and replayed per program of a launch."""

    def __init__(self, inputs: list[str], steps: list, constants: dict, input_types: list):
        self.inputs = inputs  # the kernel arguments whose values fill slots 0..len-1
        self.steps = len(steps)
        source = Source(constants)
        lines = [f"def run(b, T, {''.join(f'v{i}, ' for i in range(len(inputs)))}):"]
        for fn, operands, keywords, result, host, _ in steps:
            args = ([] if host else ["b"]) + [source.operand(x) for x in operands]
            args += [f"{k}={source.operand(x)}" for k, x in keywords.items()]
            lines += source.assign(f"{source.global_name(fn)}({', '.join(args)})", result)
        self.source, self._run = source.compile(lines)
        # what iris_core.sim.batched makes its batched form of (the interpreter, when first asked), and that form
        self.recording = (inputs, steps, constants, input_types)
        self.batched = None

    def run(self, builder, arguments: dict, tensor) -> None:
        self._run(builder, tensor, *[arguments[name].handle for name in self.inputs])


class _NotKept(Exception):
    """The recording cannot be replayed (why: its message)."""


class Recorder:
    """Records the builder's operations while one program of a launch runs (a context manager;
    `program()` afterwards: the Program, or None when the run cannot be replayed)."""

    def __init__(self, ti, arguments: dict):
        self.ti = ti
        self.slots: dict[int, int] = {}  # id(value) -> slot
        self.alive: list = []  # the recorded values, kept so that their ids stay theirs
        self.steps: list = []
        self.constants: dict = {}  # slot -> the value of an operation computed once, at the recording
        self.inputs: list[str] = []
        self.input_types: list = []  # each input's (type name, handle's type): what a batched run checks
        self.depth = 0  # >0: inside a recorded step (its inner builder calls are its own)
        self.why: str | None = None
        for name, value in arguments.items():
            handle = getattr(value, "handle", None)
            if handle is not None:
                self.inputs.append(name)
                self.input_types.append((str(value.type), handle.dtype))
                self._keep(handle)

    # -- recording -------------------------------------------------------------
    def _keep(self, value) -> int:
        slot = len(self.alive)
        self.slots[id(value)] = slot
        self.alive.append(value)
        return slot

    def _operand(self, x, host: bool):
        slot = self.slots.get(id(x))
        if slot is not None and self.alive[slot] is x:
            return _Slot(slot)
        cls = x.__class__
        if cls is self.ti.TensorHandle:
            raise _NotKept("a value made outside the builder")
        if host and cls is self._tensor_class:
            return _Tensor(self._operand(x.handle, False).index, x.type)
        if cls is tuple or cls is list:
            items = [self._operand(item, host) for item in x]
            if any(item.__class__ in (_Slot, _Tensor, _Sequence) for item in items):
                return _Sequence(cls, items)
        return x

    def _record(self, fn, args, kwargs, out, host: bool, pure: bool = False, name: str | None = None):
        if len(self.steps) >= _MAX_STEPS:
            raise _NotKept(f"more than {_MAX_STEPS} operations")
        operands = [self._operand(x, host) for x in args]
        keywords = {k: self._operand(x, host) for k, x in kwargs.items()}
        if out is None:
            self.steps.append((fn, operands, keywords, None, host, name))
            return
        items = list(out) if out.__class__ is tuple or out.__class__ is list else []
        slot = self._keep(out)
        for item in items:
            self._keep(item)
        if pure and not any(self._varies(x) for x in (*operands, *keywords.values())):
            # the same at every replay (a constant, a range, arithmetic on them): computed once, here
            for i, value in enumerate([out, *items]):
                self.constants[slot + i] = value
                data = getattr(value, "data", None)
                if data is not None and hasattr(data, "flags"):
                    data.flags.writeable = False  # (shared by every replay: an operation that wrote to it would fail)
            return
        self.steps.append((fn, operands, keywords, (slot, len(items)), host, name))

    def _varies(self, x) -> bool:
        cls = x.__class__
        if cls is _Slot or cls is _Tensor:
            return x.index not in self.constants
        if cls is _Sequence:
            return any(self._varies(item) for item in x.items)
        return False

    def builder_step(self, name: str, fn):
        recorder = self
        pure = not any(word in name for word in _IMPURE)

        def step(builder, *args, **kwargs):
            if recorder.depth or recorder.why:
                return fn(builder, *args, **kwargs)
            recorder.depth += 1
            try:
                out = fn(builder, *args, **kwargs)
            finally:
                recorder.depth -= 1
            recorder.guard(lambda: recorder._record(fn, args, kwargs, out, False, pure, name))
            return out

        return step

    def run_host_step(self, fn, args):
        if self.depth or self.why:
            return fn(*args)
        self.depth += 1
        try:
            out = fn(*args)
        finally:
            self.depth -= 1
        if out is not None:
            self.give_up(f"{fn.__name__} returned a value")
        self.guard(lambda: self._record(fn, args, {}, None, True))
        return out

    def guard(self, record) -> None:
        try:
            record()
        except _NotKept as e:
            self.give_up(str(e))

    def give_up(self, why: str) -> None:
        if self.why is None:
            self.why = why

    def reads(self, what: str):
        """A wrapper for a function by which Python reads a value (its first argument): the run
        depends on the data, unless the value is one of the recording's constants (Triton's
        front end asks `if other` of a load's constant `other`)."""
        recorder = self

        def wrap(fn):
            def read(value, *args, **kwargs):
                if not recorder.depth and not recorder._constant(value):
                    recorder.give_up(what)
                return fn(value, *args, **kwargs)
            return read

        return wrap

    def _constant(self, value) -> bool:
        handle = getattr(value, "handle", value)
        slot = self.slots.get(id(handle))
        return slot is not None and self.alive[slot] is handle and slot in self.constants

    # -- the recording's lifetime ---------------------------------------------
    def __enter__(self):
        ti = self.ti
        import triton.language as tl

        self._tensor_class = tl.core.tensor
        scope = self._scope = ti._LangPatchScope()
        builder = ti.InterpreterBuilder
        for name, member in list(vars(builder).items()):
            if callable(member) and (name.startswith(("create_", "get_")) or name.endswith("_op")
                                     or name == "cast_impl") and not name.endswith("_ty"):
                scope.set_attr(builder, name, self.builder_step(name, member))
        for cls in (tl.core.tensor, ti.TensorHandle):
            for name in ("__bool__", "__index__"):
                member = getattr(cls, name, None)
                if member is not None:
                    scope.set_attr(cls, name, self.reads(f"a value read by {cls.__name__}.{name}")(member))
        handle_init = ti.TensorHandle.__post_init__
        recorder = self

        def post_init(handle):
            if not recorder.depth:
                recorder.give_up("a value made outside the builder")
            handle_init(handle)

        scope.set_attr(ti.TensorHandle, "__post_init__", post_init)
        print_ = builtins.print

        def host_print(*args, **kwargs):
            if not recorder.depth:
                recorder.give_up("print")
            return print_(*args, **kwargs)

        scope.set_attr(builtins, "print", host_print)
        _RECORDING.recorder = self
        return self

    def __exit__(self, *exc):
        _RECORDING.recorder = None
        self._scope.restore()
        if exc[0] is not None:
            self.give_up("the run raised")

    def program(self) -> Program | None:
        if self.why is not None:
            return None
        return Program(self.inputs, self.steps, self.constants, self.input_types)


class _Recording(threading.local):
    recorder: Recorder | None = None


_RECORDING = _Recording()


def host_step(fn, *args):
    """Calls `fn(*args)`, a check the simulator makes inside a kernel (it returns nothing; its
    tensor arguments are read with numpy): a step of the program being recorded, run again at
    every replay."""
    recorder = _RECORDING.recorder
    if recorder is None:
        return fn(*args)
    return recorder.run_host_step(fn, args)


def host_only(what: str) -> None:
    """Says that the running kernel does something only the host does (reads the clock, sleeps):
    its recording, if one is being made, is not kept."""
    recorder = _RECORDING.recorder
    if recorder is not None and not recorder.depth:
        recorder.give_up(what)
