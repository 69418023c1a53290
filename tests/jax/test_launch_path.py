"""The GPU launch path of iris kernels (iris_jax.gpu_lowering): jax-triton's legacy custom call,
retargeted to jaxlib's Triton FFI handler registered as command-buffer compatible. Checked
without a GPU: the custom call is built and rewritten in MLIR."""

from __future__ import annotations

import contextlib
import warnings
import zlib
from types import SimpleNamespace

import pytest
from jax._src.interpreters import mlir  # custom_call: the builder jax-triton lowers through
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import func

from iris_core.errors import IrisError
from iris_jax import gpu_lowering


@contextlib.contextmanager
def _legacy_call(backend_config: bytes):
    """(module, op): a custom call as jax-triton emits it (api_version 2, the kernel's bytes
    as backend_config, side effect set as iris's lowering sets it) in a fresh MLIR module."""
    with mlir.make_ir_context(), ir.Location.unknown():
        module = ir.Module.create()
        tensor = ir.RankedTensorType.get([7], ir.F32Type.get())
        with ir.InsertionPoint(module.body):
            fn = func.FuncOp("main", ir.FunctionType.get([tensor], [tensor]))
            with ir.InsertionPoint(fn.add_entry_block()):
                op = mlir.custom_call("triton_kernel_call", result_types=[tensor], operands=list(fn.arguments),
                                      backend_config=backend_config, api_version=2, has_side_effect=True)
                func.ReturnOp(op.results)
        yield module, op


def test_retarget_makes_a_typed_ffi_call_with_the_same_kernel():
    kernel = zlib.compress(b"serialized TritonAnyKernelCall")
    with _legacy_call(kernel) as (module, op):
        gpu_lowering._retarget(op.operation, gpu_lowering.GRAPH_TARGET)
        assert ir.StringAttr(op.attributes["call_target_name"]).value == gpu_lowering.GRAPH_TARGET
        assert ir.IntegerAttr(op.attributes["api_version"]).value == 4  # typed FFI
        config = ir.DictAttr(op.attributes["backend_config"])
        assert ir.StringAttr(config["opaque"]).value_bytes == kernel
        assert ir.BoolAttr(op.attributes["has_side_effect"]).value
        assert module.operation.verify()


def test_retarget_refuses_what_is_not_a_compressed_kernel():
    with _legacy_call(b"not zlib") as (_, op):
        with pytest.raises(zlib.error):
            gpu_lowering._retarget(op.operation, gpu_lowering.GRAPH_TARGET)


@pytest.fixture
def fresh_registration(monkeypatch):
    """graph_target as in a new process: not yet registered; registrations are recorded."""
    from jax._src.lib import gpu_triton

    registered = []
    monkeypatch.delitem(gpu_lowering._registration, "target", raising=False)
    fake = SimpleNamespace(registrations=lambda: {"triton_kernel_call_ffi": {"execute": "capsule"}})
    monkeypatch.setattr(gpu_triton, "_cuda_triton", fake, raising=False)
    monkeypatch.setattr(gpu_lowering.jax.ffi, "register_ffi_target", lambda *a, **k: registered.append((a, k)))
    yield registered
    monkeypatch.delitem(gpu_lowering._registration, "target", raising=False)


def test_graph_target_registers_jaxlibs_handler_as_capturable_once(monkeypatch, fresh_registration):
    from jax._src.lib import xla_client

    monkeypatch.setenv("IRIS_TRITON_CALL", "ffi")
    assert gpu_lowering.graph_target() == gpu_lowering.GRAPH_TARGET
    assert gpu_lowering.graph_target() == gpu_lowering.GRAPH_TARGET
    ((args, kwargs),) = fresh_registration
    assert args == (gpu_lowering.GRAPH_TARGET, {"execute": "capsule"})
    assert kwargs == {"platform": "CUDA", "traits": xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE}


def test_graph_target_legacy_mode_and_missing_handler(monkeypatch, fresh_registration):
    from jax._src.lib import gpu_triton

    monkeypatch.setenv("IRIS_TRITON_CALL", "legacy")
    assert gpu_lowering.graph_target() is None
    monkeypatch.setenv("IRIS_TRITON_CALL", "ffi")
    monkeypatch.setattr(gpu_triton, "_cuda_triton", SimpleNamespace(registrations=lambda: {}))
    assert gpu_lowering.graph_target() is None
    assert fresh_registration == []


def test_graph_target_falls_back_when_the_plugin_refuses_traits(monkeypatch, fresh_registration):
    def refuse(*args, **kwargs):
        raise RuntimeError("UNIMPLEMENTED: The plugin does not support custom call traits.")

    monkeypatch.setattr(gpu_lowering.jax.ffi, "register_ffi_target", refuse)
    monkeypatch.setenv("IRIS_TRITON_CALL", "ffi")
    with pytest.warns(UserWarning, match="does not support custom call traits"):
        assert gpu_lowering.graph_target() is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gpu_lowering.graph_target() is None  # decided once: no second attempt, no second warning


def test_bad_launch_mode_is_refused(monkeypatch):
    monkeypatch.setenv("IRIS_TRITON_CALL", "fast")
    with pytest.raises(IrisError, match="IRIS_TRITON_CALL"):
        gpu_lowering.graph_target()
