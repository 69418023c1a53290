"""Faster equivalents of triton 3.6's language internals, set for the length of a launch.

The interpreter runs a kernel's scalar code through Triton's front end: every `a + b` goes
through a builtin's wrappers, type checks and new type objects, a few dozen Python calls
each, and that per-operation overhead is most of a small launch's time (profiled).
Each function here returns what Triton's would (same values, types
and errors: anything off the common path goes to Triton's own); only the work is less.
"""

from __future__ import annotations

import builtins


def patch_attr(ti):
    """triton.runtime.interpreter._patch_attr, binding the builtin's function directly: the
    original's lambda filters kwargs into a new dict and then calls the builtin's wrapper,
    which only checks that _semantic is set (it always is here)."""
    original = ti._patch_attr

    def _patch_attr(obj, name, member, builder, scope):
        fn = getattr(member, "__wrapped__", None)
        if fn is None:
            return original(obj, name, member, builder, scope)
        semantic = ti.TritonSemantic(builder)

        def new_member(*args, **kwargs):
            kwargs["_semantic"] = semantic
            return fn(*args, **kwargs)

        scope.set_attr(obj, name, new_member)

    return _patch_attr


def launch_patches(core):
    """[(object, name, value)] to set while a launch runs: one per internal of Triton's made faster."""
    return [_unwrap_patch(core), _tuple_eq_patch(core), _block_type_patch(core), _type_checking_patch(core),
            _broadcast_patch(core)]


def _unwrap_patch(core):
    """core._unwrap_if_constexpr, answering the common classes without Triton's checks."""
    constexpr = core.constexpr
    unwrap_original = core._unwrap_if_constexpr
    plain = {core.tensor, int, float, bool, str, type(None), core.dtype, core.pointer_type, core.block_type}

    def unwrap(o):
        cls = o.__class__
        if cls is constexpr:
            return o.value
        if cls in plain:
            return o
        return unwrap_original(o)

    return core, "_unwrap_if_constexpr", unwrap


def _tuple_eq_patch(core):
    """A language tuple's ==, against a tuple or list of ints without building a language tuple."""
    constexpr, ltuple = core.constexpr, core.tuple
    eq_original = ltuple.__eq__

    def tuple_eq(self, other):
        # as Triton's, without building a language tuple (and its type's name) from `other`
        cls = other.__class__
        if cls is ltuple:
            values = other.values
        elif cls is list or cls is builtins.tuple:
            values = other
        else:
            return eq_original(self, other)
        unwrapped = []
        for v in values:
            c = v.__class__
            if c is constexpr:
                v = v.value
            elif c is not int:
                return eq_original(self, other)
            unwrapped.append(v)
        return constexpr(self.values == unwrapped)

    return ltuple, "__eq__", tuple_eq


def _block_type_patch(core):
    """block_type.__init__, with each shape checked and its types built once per launch."""
    constexpr, ltuple, block_type = core.constexpr, core.tuple, core.block_type
    init_original = block_type.__init__
    shapes: dict = {}  # the shape's ints -> (its tuple type, numel, its str)
    names: dict = {}

    def block_init(self, element_ty, shape):
        # Triton's checks the shape and builds a language tuple, its type and the type's name
        # every time; the same few shapes recur, so they are checked and built once
        cls = shape.__class__
        key = None
        if cls is list or cls is ltuple:
            key = []
            for s in (shape.values if cls is ltuple else shape):
                c = s.__class__
                if c is constexpr:
                    s = s.value
                elif c is not int:
                    key = None
                    break
                key.append(s)
        if key is None:
            return init_original(self, element_ty, shape)
        key = builtins.tuple(key)
        known = shapes.get(key)
        if known is None:
            init_original(self, element_ty, shape)
            shapes[key] = self.shape.type, self.numel, str(self.shape)
            names[key, str(element_ty)] = self.name
            return
        self.element_ty = element_ty
        self.shape = ltuple(list(key), known[0])
        self.numel = known[1]
        element = str(element_ty)
        name = names.get((key, element))
        if name is None:
            name = names[key, element] = f"<{known[2]}, {element}>"
        self.name = name

    return block_type, "__init__", block_init


def _type_checking_patch(core):
    """TritonSemantic.binary_op_type_checking_impl, answering the common cases without promotion."""
    from triton.language.semantic import TritonSemantic

    checking_original = TritonSemantic.binary_op_type_checking_impl
    tensor = core.tensor
    ranges = {f"{s}int{b}": ((-(1 << (b - 1)), (1 << (b - 1)) - 1) if s == "" else (0, (1 << b) - 1))
              for s in ("", "u") for b in (8, 16, 32, 64)}
    ints = set(ranges)
    ranges.update(fp32=(-float("inf"), float("inf")), fp64=(-float("inf"), float("inf")))
    same_ok = {*ranges, "int1"}

    def binary_op_type_checking_impl(self, lhs, rhs, allow_lhs_ptr=False, allow_rhs_ptr=False, arithmetic_check=True,
                                     div_or_mod=False):
        # Triton's checks and promotion, for the common cases whose answer is known without them:
        # tensors of one integer (or fp32/fp64) element type (no cast, only the broadcast); such a
        # tensor and a Python int in its type's range (the int becomes a constant of that type); a
        # pointer (where allowed) and an integer tensor or int (no promotion for pointers). Without
        # arithmetic_check (bitwise ops promote by themselves) an int stays Triton's own constant.
        lc, rc = lhs.__class__, rhs.__class__
        if lc is tensor:
            ls = lhs.type.scalar
            if rc is tensor:
                rs = rhs.type.scalar
                if ls.name in same_ok and (ls is rs or ls == rs):
                    return self.broadcast_impl_value(lhs, rhs)
                if allow_lhs_ptr and rs.name in ints and ls.is_ptr():
                    return self.broadcast_impl_value(lhs, rhs)
            elif rc is int:
                bounds = ranges.get(ls.name)
                if bounds is not None:
                    if arithmetic_check and bounds[0] <= rhs <= bounds[1]:
                        return self.broadcast_impl_value(lhs, self.scalar_constant(rhs, dtype=ls))
                elif allow_lhs_ptr and ls.is_ptr() and -(1 << 63) <= rhs < (1 << 64):
                    return self.broadcast_impl_value(lhs, self.to_tensor(rhs))
        elif lc is int and rc is tensor:
            rs = rhs.type.scalar
            bounds = ranges.get(rs.name)
            if arithmetic_check and bounds is not None and bounds[0] <= lhs <= bounds[1]:
                return self.broadcast_impl_value(self.scalar_constant(lhs, dtype=rs), rhs)
        return checking_original(self, lhs, rhs, allow_lhs_ptr, allow_rhs_ptr, arithmetic_check, div_or_mod)

    return TritonSemantic, "binary_op_type_checking_impl", binary_op_type_checking_impl


def _broadcast_patch(core):
    """TritonSemantic.broadcast_impl_value, returning two scalars, or two blocks of one shape, as
    they are (what Triton's returns for them, after building and comparing their shapes: a
    quarter of a small launch's time; 27 of the 38 broadcasts of the README's kernel)."""
    from triton.language.semantic import TritonSemantic

    broadcast_original = TritonSemantic.broadcast_impl_value
    block_type = core.block_type

    def broadcast_impl_value(self, lhs, rhs):
        lt, rt = lhs.type, rhs.type
        lb, rb = lt.__class__ is block_type, rt.__class__ is block_type
        if not (lb or rb or lt.is_block() or rt.is_block()):
            return lhs, rhs
        if lb and rb and lt.shape.values == rt.shape.values:
            return lhs, rhs
        return broadcast_original(self, lhs, rhs)

    return TritonSemantic, "broadcast_impl_value", broadcast_impl_value
