"""The GPU launch path of iris kernels (iris_jax.call): jax-triton's legacy custom call,
retargeted to jaxlib's Triton FFI handler registered as command-buffer compatible. Checked
without a GPU: the custom call is built and rewritten in MLIR."""

from __future__ import annotations

import zlib

import pytest
from jax._src.interpreters import mlir  # custom_call: the builder jax-triton lowers through
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import func

from iris_core.errors import IrisError
from iris_jax import call


def test_retarget_makes_a_typed_ffi_call_with_the_same_kernel():
    kernel = zlib.compress(b"serialized TritonAnyKernelCall")
    with mlir.make_ir_context(), ir.Location.unknown():
        module = ir.Module.create()
        tensor = ir.RankedTensorType.get([7], ir.F32Type.get())
        with ir.InsertionPoint(module.body):
            fn = func.FuncOp("main", ir.FunctionType.get([tensor], [tensor]))
            with ir.InsertionPoint(fn.add_entry_block()):
                op = mlir.custom_call("triton_kernel_call", result_types=[tensor], operands=list(fn.arguments),
                                      backend_config=kernel, api_version=2, has_side_effect=True)
                func.ReturnOp(op.results)
        call._retarget(op.operation, call.GRAPH_TARGET)
        assert ir.StringAttr(op.attributes["call_target_name"]).value == call.GRAPH_TARGET
        assert ir.IntegerAttr(op.attributes["api_version"]).value == 4  # typed FFI
        config = ir.DictAttr(op.attributes["backend_config"])
        assert ir.StringAttr(config["opaque"]).value_bytes == kernel
        assert ir.BoolAttr(op.attributes["has_side_effect"]).value
        assert module.operation.verify()


def test_retarget_refuses_what_is_not_a_compressed_kernel():
    with mlir.make_ir_context(), ir.Location.unknown():
        module = ir.Module.create()
        tensor = ir.RankedTensorType.get([3], ir.F32Type.get())
        with ir.InsertionPoint(module.body):
            fn = func.FuncOp("main", ir.FunctionType.get([tensor], [tensor]))
            with ir.InsertionPoint(fn.add_entry_block()):
                op = mlir.custom_call("triton_kernel_call", result_types=[tensor], operands=list(fn.arguments),
                                      backend_config=b"not zlib", api_version=2)
                func.ReturnOp(op.results)
        with pytest.raises(zlib.error):
            call._retarget(op.operation, call.GRAPH_TARGET)


@pytest.mark.parametrize("mode", ["legacy", "ffi"])
def test_graph_target_follows_the_mode_and_jaxlib(monkeypatch, mode):
    from jax._src.lib import gpu_triton

    plugin = getattr(gpu_triton, "_cuda_triton", None)
    has_ffi = bool(plugin) and "triton_kernel_call_ffi" in plugin.registrations()
    monkeypatch.setenv("IRIS_TRITON_CALL", mode)
    call.graph_target.cache_clear()
    try:
        assert call.graph_target() == (call.GRAPH_TARGET if mode == "ffi" and has_ffi else None)
    finally:
        call.graph_target.cache_clear()


def test_bad_launch_mode_is_refused(monkeypatch):
    monkeypatch.setenv("IRIS_TRITON_CALL", "fast")
    call.graph_target.cache_clear()
    try:
        with pytest.raises(IrisError, match="IRIS_TRITON_CALL"):
            call.graph_target()
    finally:
        call.graph_target.cache_clear()
