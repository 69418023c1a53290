"""iris's GPU lowering (iris_jax.calls.gpu_lowering) checked without a GPU: programs lowered for "cuda"
here, every kernel compiled for sm_90 by Triton, jaxlib's kernel-call objects recorded by a
stand-in (jaxlib's Triton launcher comes with JAX's CUDA plugin, which CPU machines lack)."""

from __future__ import annotations

import zlib
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest
import triton
import triton.language as tl
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_jax import compat
from iris_jax.calls import fault_gate, gpu_lowering, kernel_cache
from tests.jax.helpers import use_runtime


class _Jaxlib:
    """Records what the lowering builds with jaxlib's Triton bindings."""

    def __init__(self):
        self.kernels, self.calls = [], []

    def TritonKernel(self, *args):  # noqa: N802 (jaxlib's name)
        self.kernels.append(args)
        return SimpleNamespace(args=args)

    def TritonKernelCall(self, kernel, gx, gy, gz, params):  # noqa: N802
        call = SimpleNamespace(kernel=kernel, grid=(gx, gy, gz), params=params)
        self.calls.append(call)
        call.to_proto = lambda name, metadata: repr((len(self.calls) - 1, name, metadata)).encode()
        return call

    @staticmethod
    def create_array_parameter(zeroed_bytes, alignment):
        return ("array", zeroed_bytes, alignment)

    @staticmethod
    def create_scalar_parameter(value, dtype):
        return ("scalar", value, dtype)

    @staticmethod
    def get_compute_capability(device):
        return 90


@pytest.fixture
def jaxlib(monkeypatch, tmp_path):
    fake = _Jaxlib()
    monkeypatch.setattr(compat, "gpu_triton", lambda: fake)
    monkeypatch.setattr(gpu_lowering, "_kernels", {})
    monkeypatch.setattr(kernel_cache, "_state", {"cache": kernel_cache.KernelCache(str(tmp_path))})
    return fake


@triton.jit
def _scale_into(context_ptr, x_ptr, n, one, factor, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n * one
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * factor, mask=mask)


_GATE_TARGETS = (fault_gate.TARGET, fault_gate.NESTED_TARGET, fault_gate.PASSED_TARGET)


def _hlo_calls(text: str) -> list[str]:
    """The kernel calls of a lowered program (its fault gates left out)."""
    return [line for line in text.splitlines() if "stablehlo.custom_call" in line and not _gates(line)]


def _gates(text: str, *targets: str) -> list[str]:
    return [line for line in text.splitlines() if any(f"@{t}(" in line for t in targets or _GATE_TARGETS)]


def test_every_kernel_is_followed_by_a_fault_gate_that_aliases_its_outputs(jaxlib):
    use_runtime(2)
    mesh = jax.sharding.Mesh(jax.devices()[:2], ("x",))
    step = lambda v: iris_jax.all_gather(iris_jax.psum(v, "x") * 2, "x")
    f = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    text = f.trace(jax.ShapeDtypeStruct((2 * 64,), jnp.float32)).lower(lowering_platforms=("cuda",)).as_text()
    lines = [line for line in text.splitlines() if "stablehlo.custom_call" in line]
    kernels, gates = _hlo_calls(text), _gates(text)
    assert len(kernels) == len(gates) >= 2
    for kernel, gate in zip(kernels, gates):
        assert lines.index(gate) == lines.index(kernel) + 1  # each kernel's outputs go through its gate
        result = kernel.split("=")[0].strip()
        assert f", {result})" in gate or f", {result}#0" in gate  # after the token of the function's chain
        assert "has_side_effect = true" in gate and "output_operand_aliases" in gate


def _chain(text: str) -> list[tuple[str, str, str]]:
    """(target, token in, token out) of each gate of a lowered program, in order."""
    gates = _gates(text)
    return [(next(t for t in _GATE_TARGETS if f"@{t}(" in g), g.split("(")[1].split(",")[0].strip(),
             g.split("=")[0].split(":")[0].strip()) for g in gates]


def test_a_function_waits_once_its_gates_chained_by_tokens(jaxlib):
    """Step mode: the gates of one function pass a token along and only the last is an anchor (one
    host step, after every kernel of the function); a jitted helper's function has its own chain."""
    use_runtime(2)
    mesh = jax.sharding.Mesh(jax.devices()[:2], ("x",))
    helper = jax.jit(lambda v: iris_jax.psum(v, "x") + iris_jax.psum(v * 2, "x"))
    step = lambda v: helper(iris_jax.psum(jnp.sin(v), "x") + iris_jax.pmax(v, "x") + iris_jax.psum(v, "x"))
    f = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
    text = f.trace(jax.ShapeDtypeStruct((2 * 64,), jnp.float32)).lower(lowering_platforms=("cuda",)).as_text()
    functions = text.split("func.func")[1:]
    chains = [_chain(body) for body in functions if _gates(body)]
    assert sorted(len(c) for c in chains) == [2, 3]  # the helper's two calls, the step's three
    for chain in chains:
        targets = [target for target, _, _ in chain]
        assert targets == [fault_gate.PASSED_TARGET] * (len(chain) - 1) + [fault_gate.TARGET]
        for (_, _, out), (_, token, _) in zip(chain, chain[1:]):
            assert token == f"{out}#0"  # the gate before's token
    assert "stablehlo.create_token" in text


def test_every_gate_is_an_anchor_in_call_mode_and_gates_in_control_flow_are_nested(jaxlib):
    rt = use_runtime(2)
    mesh = jax.sharding.Mesh(jax.devices()[:2], ("x",))
    step = lambda v: jax.lax.cond(v[0] > 0, lambda u: iris_jax.psum(u, "x"), lambda u: u,
                                  iris_jax.psum(v, "x") + iris_jax.psum(v * 2, "x"))
    x = jax.ShapeDtypeStruct((2 * 64,), jnp.float32)
    for mode, anchors in (("step", 1), ("call", 2)):
        gate, rt.fault_gate = rt.fault_gate, mode
        try:  # (a new jit: JAX keeps a function's lowering)
            f = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
            text = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
        finally:
            rt.fault_gate = gate
        assert len(_gates(text, fault_gate.TARGET)) == anchors
        assert len(_gates(text, fault_gate.PASSED_TARGET)) == 2 - anchors
        assert len(_gates(text, fault_gate.NESTED_TARGET)) == 1  # the psum inside the cond
        assert ("stablehlo.token" in text) == (mode == "step")


def test_no_fault_gate_is_lowered_when_it_is_off(jaxlib):
    rt = use_runtime(2)
    mesh = jax.sharding.Mesh(jax.devices()[:2], ("x",))
    f = jax.jit(jax.shard_map(lambda v: iris_jax.psum(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P()))
    gate, rt.fault_gate = rt.fault_gate, "off"
    try:
        text = f.trace(jax.ShapeDtypeStruct((128,), jnp.float32)).lower(lowering_platforms=("cuda",)).as_text()
    finally:
        rt.fault_gate = gate
    assert _hlo_calls(text) and not _gates(text)


def test_a_kernel_call_lowers_to_jaxlibs_launcher(jaxlib):
    use_runtime(1)
    step = lambda x: iris_jax.triton_call(x, 37, 1, 2.5, kernel=_scale_into, grid=(1,), BLOCK=64,
                                          out_shape=jax.ShapeDtypeStruct((37,), jnp.float32), zeroed_outputs=(0,))
    text = jax.jit(step).trace(jnp.zeros(37, jnp.float32)).lower(lowering_platforms=("cuda",)).as_text()
    (call_line,) = _hlo_calls(text)
    assert ("@triton_kernel_call_ffi" in call_line or f"@{gpu_lowering.GRAPH_TARGET}" in call_line)
    assert "has_side_effect = true" in call_line and "mhlo.backend_config = {opaque" in call_line  # typed FFI
    (call,) = jaxlib.calls
    # context row, x, n (i32), the constant 1 compiled in (no parameter), factor (fp64), out zeroed
    assert call.params == [("array", 0, 16), ("array", 0, 16), ("scalar", 37, "i32"), ("scalar", 2.5, "fp64"),
                           ("array", 37 * 4, 16)]
    assert call.grid == (1, 1, 1)
    ((name, warps, ctas, shared, ptx, ttir, cc),) = jaxlib.kernels
    assert (name, warps, ctas, cc) == ("_scale_into", 4, 1, 90)
    assert ".visible .entry _scale_into" in ptx and ".target sm_90" in ptx and "tt.func" in ttir


def test_a_collective_lowers_with_its_group_row_and_compiles_for_sm90(jaxlib):
    use_runtime(2)
    mesh = jax.sharding.Mesh(jax.devices()[:2], ("x",))
    f = jax.jit(jax.shard_map(lambda v: iris_jax.psum(v, "x"), mesh=mesh, in_specs=P("x"), out_specs=P()))
    text = f.trace(jax.ShapeDtypeStruct((2 * 4099,), jnp.float32)).lower(lowering_platforms=("cuda",)).as_text()
    assert len(_hlo_calls(text)) == len(jaxlib.calls) >= 1
    for call in jaxlib.calls:
        kinds = [p[0] for p in call.params]
        assert kinds[:2] == ["array", "array"]  # the context row, the group row
        assert all(p[2] == 16 for p in call.params if p[0] == "array")
    for name, _, _, _, ptx, _, cc in jaxlib.kernels:
        assert cc == 90 and ".target sm_90" in ptx and "collective_kernel" in name


def test_the_launch_target_and_its_opaque_kernel(jaxlib):
    use_runtime(1)
    step = lambda x: iris_jax.triton_call(x, 5, 1, 1.0, kernel=_scale_into, grid=(1,), BLOCK=8,
                                          out_shape=jax.ShapeDtypeStruct((5,), jnp.float32))
    lowered = jax.jit(step).trace(jnp.zeros(5, jnp.float32)).lower(lowering_platforms=("cuda",))
    module = lowered.compiler_ir("stablehlo")
    ops = [op for op in module.body.operations[0].regions[0].blocks[0].operations
           if op.operation.name == "stablehlo.custom_call"]
    from jax._src.lib.mlir import ir

    op, gate = ops
    assert ir.StringAttr(gate.attributes["call_target_name"]).value == fault_gate.TARGET

    opaque = ir.StringAttr(ir.DictAttr(op.attributes["mhlo.backend_config"])["opaque"]).value_bytes
    assert zlib.decompress(opaque) == repr((0, "", b"")).encode()  # jaxlib's proto of the one call, compressed


def test_a_collective_in_a_partially_manual_shard_map_lowers_for_cuda(jaxlib):
    """Over the manual axis of a partially manual shard_map: the kernel inside the nested,
    fully manual region (iris_jax.collectives.primitive), lowered for "cuda" with its context and group rows."""
    use_runtime(4)
    mesh = jax.make_mesh((2, 2), ("dp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2,
                         devices=jax.devices()[:4])
    f = jax.jit(jax.shard_map(lambda v: iris_jax.psum(v, "tp"), mesh=mesh, in_specs=P(None, "tp"), out_specs=P(),
                              axis_names={"tp"}))
    x = jax.ShapeDtypeStruct((8, 2 * 37), jnp.float32, sharding=jax.sharding.NamedSharding(mesh, P("dp", "tp")))
    text = f.trace(x).lower(lowering_platforms=("cuda",)).as_text()
    assert len(_hlo_calls(text)) == len(jaxlib.calls) == 1
    assert "sdy.manual_computation" in text or "Sharding = \"{manual}\"" in text
    (call,) = jaxlib.calls
    assert [p[0] for p in call.params[:2]] == ["array", "array"]  # the context row, the group row
    assert "tensor<1x148xf32>" in _hlo_calls(text)[0]  # its rows: one dp shard of one tp shard, 4 x 37
