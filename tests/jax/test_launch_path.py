"""The GPU launch target of iris kernels (iris_jax.calls.gpu_lowering): jaxlib's Triton FFI handler,
registered once more as command-buffer compatible, or jaxlib's own where that is refused.
Checked without a GPU (the lowering itself: test_gpu_lowering.py)."""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import pytest

from iris_core.errors import IrisError
from iris_jax.calls import gpu_lowering


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
