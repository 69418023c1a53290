"""One replay for several ranks' launches of the same kernel (the simulator's batched launches).

A kernel whose program iris_core.sim.replay kept reads no value in Python, so it waits for no
one: every rank's launch makes the same operations, only on its own data. When the ranks of a
call site launch it together (a user's kernel under shard_map), the simulator runs their
launches as one replay: each value gets a leading axis of ranks and each operation runs once for
all of them, where eight replays, one per rank's worker, cost eight times the Python.

Running rank 0's operation k, then rank 1's, and so on before operation k + 1 is one of the orders
a GPU's concurrent ranks may take, so results are those of a possible run. Operations are taken
by name: elementwise ones run unchanged (numpy broadcasts the ranks' axis), the shape operations
shift their axes by one, memory operations fit their masks and values to the pointers' shape, the
program id is every rank's. Anything else (block pointers, descriptors, inline assembly, a
histogram, a poll that waits) leaves the kernel to per-rank replays. The simulator's checks inside
kernels (iris_core.sim.checks) run per rank: a rank whose check raises gets that error, and its
later loads, stores and atomics are dropped, as its own launch would have stopped there; the other
ranks go on.
"""

from __future__ import annotations

import copyreg

import numpy as np
import triton.language as tl

from iris_core.sim.replay import Source, _Sequence, _Slot, _Tensor

# builder operations that run unchanged on values with a leading axis of ranks
_ELEMENTWISE = frozenset("""
    binary_op unary_op ternary_op cast_impl create_add create_addptr create_and create_ashr create_assume
    create_barrier create_bitcast create_ceil create_clampf create_cos create_dot create_erf create_exp create_exp2
    create_fabs create_fadd create_fdiv create_floor create_fma create_fmul create_fp_ext create_fp_to_fp
    create_fp_to_si create_fp_to_ui create_fp_trunc create_frem create_fsub create_iabs create_idiv create_int_cast
    create_int_to_ptr create_log create_log2 create_lshr create_maximumf create_maxnumf create_maxsi create_maxui
    create_minimumf create_minnumf create_minsi create_minui create_mul create_or create_precise_divf
    create_precise_sqrt create_ptr_to_int create_rsqrt create_sdiv create_select create_shl create_si_to_fp
    create_sin create_split create_sqrt create_srem create_sub create_udiv create_ui_to_fp create_umulhi create_urem
    create_xor""".split())
_MEMORY = frozenset("create_load create_store create_masked_load create_masked_store create_atomic_cas "
                    "create_atomic_rmw create_atomic_load create_atomic_store".split())


_ONE_CALL = 64  # a memory operation of at most this many lanes per rank runs as one call for all ranks


class State:
    """What one batched run knows besides the values: the ranks' count, which of them still run,
    and the error each stopped with."""

    __slots__ = ("n", "alive", "errors", "everyone", "tensor_handle", "host_array", "np_dtype")

    def __init__(self, n: int, tensor_handle, host_array, np_dtype):
        self.n = n
        self.host_array, self.np_dtype = host_array, np_dtype  # the interpreter's (BatchedProgram.prepare)
        self.alive = np.ones(n, bool)
        self.everyone = True
        self.errors: list = [None] * n
        self.tensor_handle = tensor_handle

    def stop(self, i: int, error: BaseException) -> None:
        self.errors[i] = error
        self.alive[i] = False
        self.everyone = False


def _lift(S: State, value):
    """A constant of the recording (one rank's shape) given the ranks' axis."""
    if isinstance(value, tuple):
        return tuple(_lift(S, v) for v in value)
    data = getattr(value, "data", None)
    if data is None:
        return value
    return S.tensor_handle(np.broadcast_to(data, (S.n, *data.shape)), value.dtype)


def _fit(S: State, value, shape):
    """A memory operation's pointers, mask or value, broadcast to the pointers' shape and
    contiguous, as Triton's loops over lanes take them."""
    if value is None or not hasattr(value, "data"):
        return value
    data = value.data
    if data.shape == shape and data.flags.c_contiguous:
        return value
    return S.tensor_handle(np.ascontiguousarray(np.broadcast_to(data, shape)), value.dtype)


def _memory(S: State, b, fn, name: str, *args):
    """A load, store or atomic, run for each rank still running on its row: the simulator's fast
    path copies a row's one run of consecutive elements as a slice (iris_core.sim.interpreter),
    where the ranks' rows together are no one run."""
    first = next(i for i, a in enumerate(args) if hasattr(a, "data"))  # the pointers
    shape = args[first].data.shape
    args = [_fit(S, a, shape) for a in args]
    handle = S.tensor_handle
    if S.everyone and args[first].data.size <= _ONE_CALL * S.n:
        return fn(b, *args)
    if S.everyone and name in _DENSE:
        out = _dense(S, name, args)
        if out is not _NOT_DENSE:
            return out
    outs = []
    for i in (range(S.n) if S.everyone else np.flatnonzero(S.alive)):
        outs.append(fn(b, *[handle(a.data[i], a.dtype) if hasattr(a, "data") else a for a in args]))
    if not outs:
        raise _AllStopped
    if outs[0] is None:
        return None
    if S.everyone:
        return handle(np.stack([o.data for o in outs]), outs[0].dtype)
    full = np.zeros((S.n, *outs[0].data.shape), outs[0].data.dtype)
    full[S.alive] = np.stack([o.data for o in outs])
    return handle(full, outs[0].dtype)


_DENSE = ("create_load", "create_masked_load", "create_store", "create_masked_store")
_NOT_DENSE = object()
_NP_DTYPES: dict = {}


def _dense(S: State, name: str, args):
    """A load or store whose every lane is accessed and whose rows are each one run of consecutive
    elements (the common tile): copied a row at a time as slices, with no per-rank handles."""
    ptrs = args[0]
    mask = args[1] if name == "create_masked_load" else args[2] if name == "create_masked_store" else None
    if mask is not None and not mask.data.all():
        return _NOT_DENSE
    element = ptrs.get_element_ty()
    dtype = _NP_DTYPES.get(element.name)
    if dtype is None:
        dtype = _NP_DTYPES[element.name] = np.dtype(S.np_dtype(element))
    rows = ptrs.data.reshape(S.n, -1)
    if not (np.diff(rows, axis=1) == dtype.itemsize).all():
        return _NOT_DENSE
    count = rows.shape[1]
    starts = rows[:, 0].tolist()
    if name in ("create_load", "create_masked_load"):
        out = np.empty((S.n, count), dtype)
        for i, start in enumerate(starts):
            out[i] = S.host_array(start, count, dtype)
        return S.tensor_handle(out.reshape(ptrs.data.shape), element)
    values = args[1].data
    if values.dtype.itemsize != dtype.itemsize:
        return _NOT_DENSE
    values = values.reshape(S.n, count)
    for i, start in enumerate(starts):
        S.host_array(start, count, values.dtype)[:] = values[i]
    return None


def _lift_result(S: State, b, fn, *args):
    """An operation whose value is every rank's (the program id, the grid)."""
    out = fn(b, *args)
    return S.tensor_handle(np.ascontiguousarray(np.broadcast_to(out.data, (S.n, *out.data.shape))), out.dtype)


def _axis(axis: int) -> int:
    return axis + 1 if axis >= 0 else axis


def _splat(S: State, b, fn, ret_ty, arg):
    # a read-only view, as the simulator's own splat makes (every operation makes a new array)
    shape = tuple(int(s) for s in ret_ty.shape)
    data = arg.data.reshape((S.n,) + (1,) * len(shape))
    return S.tensor_handle(np.broadcast_to(data, (S.n, *shape)), arg.dtype.scalar)


def _unsplat(S: State, b, fn, arg):
    return S.tensor_handle(arg.data.reshape(S.n, -1)[:, :1].copy(), arg.dtype.scalar)


def _cat(S: State, b, fn, lhs, rhs):
    return S.tensor_handle(np.concatenate([lhs.data, rhs.data], axis=1), lhs.dtype.scalar)


def _join(S: State, b, fn, lhs, rhs):
    shape = np.broadcast_shapes(lhs.data.shape, rhs.data.shape)
    return fn(b, _fit(S, lhs, shape), _fit(S, rhs, shape))


_SHAPE = {
    "create_splat": _splat,
    "create_unsplat": _unsplat,
    "create_cat": _cat,
    "create_join": _join,
    "create_expand_dims": lambda S, b, fn, arg, axis: fn(b, arg, _axis(axis)),
    "create_broadcast": lambda S, b, fn, arg, shape: fn(b, arg, [S.n, *shape]),
    "create_reshape": lambda S, b, fn, arg, shape, *rest: fn(b, arg, [S.n, *shape], *rest),
    "create_trans": lambda S, b, fn, arg, perm: fn(b, arg, [0, *(p + 1 for p in perm)]),
    "create_gather": lambda S, b, fn, src, indices, axis: fn(b, src, indices, _axis(axis)),
    "create_get_program_id": _lift_result,
    "create_get_num_programs": _lift_result,
    "create_make_range": _lift_result,
}


class _Row:
    """One rank's tensor argument of a host step: its handle and type (host steps read tensors'
    values with numpy, iris_core.sim.replay.host_step; a language tensor costs ten times more)."""

    __slots__ = ("handle", "type")

    def __init__(self, handle, type_):
        self.handle, self.type = handle, type_


def _host(S: State, T, fn, operands) -> None:
    """A check of the simulator's (iris_core.sim.replay.host_step), run for each rank still running
    on its own values; a rank whose check raises stops with that error."""
    clear = getattr(fn, "clear_for_all", None)  # the check can tell at once that no rank fails it
    if clear is not None and clear(*[value if kind == 2 else _Row(value, type_) for kind, value, type_ in operands]):
        return
    for i in np.flatnonzero(S.alive):
        args = []
        for kind, value, type_ in operands:
            if kind == 0:  # a value with the ranks' axis: this rank's
                args.append(_Row(S.tensor_handle(value.data[i], value.dtype), type_))
            elif kind == 1:  # a constant of the recording
                args.append(_Row(value, type_))
            elif kind == 3:  # a builder value with the ranks' axis
                args.append(S.tensor_handle(value.data[i], value.dtype))
            else:
                args.append(value)
        try:
            fn(*args)
        except Exception as e:  # noqa: BLE001  (the rank's own error, raised for it after the run)
            S.stop(int(i), e)


class BatchedProgram:
    """A kept program (iris_core.sim.replay) run once for the launches of several ranks (`run`).
    It pickles as its recording, with the builder's operations by name, so a worker that recorded
    it can hand it to the process that holds every rank's buffers; `prepare` compiles it there."""

    def __init__(self, inputs: list[str], steps: list, constants: dict, input_types: list):
        self.inputs = inputs
        self.input_types = input_types  # each input's (type name, the type of its values' handle)
        # the recording, with the builder's operations by name (functions pickle by reference only)
        self._recording = (inputs, [(step[5] if not step[4] else step[0], *step[1:]) for step in steps],
                           constants, input_types)
        self.source = self._run = self._helpers = None

    def __reduce__(self):
        _picklable_types()
        return _unpickled, self._recording

    def prepare(self, builder, tensor_handle, host_array, np_dtype) -> BatchedProgram:
        """Compiles the program (once) against the interpreter's `builder` class, whose operations
        are those this process patched, and its helpers. Raises NoRule for an operation without a rule."""
        if self._run is None:
            inputs, steps, constants, _ = self._recording
            constants = {slot: _canonical(value) for slot, value in constants.items()}
            self.source, self._run = _compile(inputs, steps, constants, builder)
            self._helpers = (tensor_handle, host_array, np_dtype)
        return self

    def run(self, builder, inputs: list, tensor) -> list:
        """Runs one program of the grid (the builder's grid index) for several ranks: `inputs`, the
        values of the kernel arguments named by `self.inputs`, each with the ranks' axis first.
        Returns each rank's error, or None."""
        S = State(inputs[0].data.shape[0], *self._helpers)
        try:
            self._run(builder, tensor, S, *inputs)
        except _AllStopped:
            pass
        except Exception as e:  # noqa: BLE001  (an operation failed: every rank still running fails with it)
            for i in np.flatnonzero(S.alive):
                S.stop(int(i), e)
        return S.errors


def _unpickled(inputs, steps, constants, input_types) -> BatchedProgram:
    program = BatchedProgram.__new__(BatchedProgram)
    program.inputs, program.input_types = inputs, input_types
    program._recording = (inputs, steps, constants, input_types)
    program.source = program._run = program._helpers = None
    return program


def _compile(inputs: list[str], steps: list, constants: dict, builder):
    source = Source(constants)
    lift = source.global_name(_lift)

    def operand(x, lifted: bool) -> str:
        if x.__class__ is _Sequence:
            raise NoRule("a list of values as an operand")
        text = source.operand(x)
        if lifted and x.__class__ is _Slot and x.index in constants:
            return f"{lift}(S, {text})"
        return text

    lines = [f"def run(b, T, S, {''.join(f'v{i}, ' for i in range(len(inputs)))}):"]
    for fn, operands, keywords, result, host, name in steps:
        if host:
            specs = []
            for x in operands:
                if x.__class__ is _Tensor:
                    kind = 1 if x.index in constants else 0
                    specs.append(f"({kind}, {source.operand(_Slot(x.index))}, {source.global_name(x.type)})")
                elif x.__class__ is _Slot and x.index not in constants:
                    specs.append(f"(3, {source.operand(x)}, None)")
                else:
                    specs.append(f"(2, {operand(x, False)}, None)")
            call = f"{source.global_name(_host)}(S, T, {source.global_name(fn)}, ({''.join(s + ', ' for s in specs)}))"
        elif keywords:
            raise NoRule(f"{name} with keyword operands")
        else:
            op = getattr(builder, fn)  # (`fn`: the operation's name)
            if fn in _ELEMENTWISE or fn.startswith(("create_icmp", "create_fcmp", "get_")):
                call = f"{source.global_name(op)}(b, {''.join(operand(x, False) + ', ' for x in operands)})"
            elif fn in _MEMORY:
                args = "".join(operand(x, True) + ", " for x in operands)
                call = f"{source.global_name(_memory)}(S, b, {source.global_name(op)}, {fn!r}, {args})"
            elif fn in _SHAPE:
                args = "".join(operand(x, True) + ", " for x in operands)
                call = f"{source.global_name(_SHAPE[fn])}(S, b, {source.global_name(op)}, {args})"
            else:
                raise NoRule(fn)
        lines += source.assign(call, result)
    return source.compile(lines)


def _canonical(value):
    """A constant with numpy's own dtype object: an unpickled array has an equal copy of it, which
    Triton's C++ loops (atomics) refuse ("Unsupported data type")."""
    if isinstance(value, tuple):
        return tuple(_canonical(v) for v in value)
    data = getattr(value, "data", None)
    if not isinstance(data, np.ndarray) or data.dtype is np.dtype(data.dtype.type):
        return value
    canonical = type(value)(data.view(np.dtype(data.dtype.type)), value.dtype)
    return canonical


def _picklable_types() -> None:
    """Has pickle take Triton's block types by element type and shape (their shape holds
    language tuples, which do not unpickle)."""
    copyreg.pickle(tl.block_type, lambda t: (tl.block_type, (t.element_ty, [int(d) for d in t.shape])))


class NoRule(Exception):
    """An operation of the recording without a batched form (its name)."""


class _AllStopped(Exception):
    """Every rank of the run stopped: nothing is left to run."""
