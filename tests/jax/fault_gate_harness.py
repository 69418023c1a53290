"""Drives the fault gate's C step (iris_jax/calls/fault_gate.c) as XLA would, without a GPU:
a stand-in libcuda (built here), call frames with a stand-in FFI API, and a fault page in host
memory. Run by tests/jax/test_fault_gate.py in a process of its own (the stand-in must not meet
JAX's CUDA plugin); prints one line per scenario: `NAME: waited W, error MESSAGE`."""

import ctypes
import os
import subprocess
import sys
import tempfile

import numpy as np

FAKE_CUDA = r"""
#include <stdint.h>
#include <string.h>
int cuCtxGetDevice(int *device) { *device = 0; return 0; }
int cuMemcpyDtoHAsync_v2(void *dst, uint64_t src, size_t n, void *stream) { memcpy(dst, (void *)src, n); return 0; }
int cuStreamSynchronize(void *stream) { return 0; }
int cuCtxSynchronize(void) { return 0; }
int cuMemsetD32Async(uint64_t dst, unsigned int value, size_t n, void *stream) {
    for (size_t i = 0; i < n; i++) ((uint32_t *)dst)[i] = value;
    return 0;
}
"""


def _fake_cuda() -> str:
    directory = tempfile.mkdtemp(prefix="iris-fake-cuda-")
    source, library = os.path.join(directory, "cuda.c"), os.path.join(directory, "libcuda.so.1")
    with open(source, "w") as f:
        f.write(FAKE_CUDA)
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", source, "-o", library], check=True)
    return library


class _Query(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("ext", ctypes.c_void_p), ("ctx", ctypes.c_void_p),
                ("value", ctypes.c_void_p)]


class _ErrorArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("ext", ctypes.c_void_p), ("message", ctypes.c_char_p),
                ("errc", ctypes.c_int)]


class _Api(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("ext", ctypes.c_void_p), ("version_size", ctypes.c_size_t),
                ("version_ext", ctypes.c_void_p), ("major", ctypes.c_int), ("minor", ctypes.c_int),
                ("internal", ctypes.c_void_p), ("functions", ctypes.c_void_p * 18)]


class _Frame(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("ext", ctypes.c_void_p), ("api", ctypes.POINTER(_Api)),
                ("ctx", ctypes.c_void_p), ("stage", ctypes.c_int)]


QUERY = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_Query))
ERROR = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_ErrorArgs))
PREPARE, EXECUTE = 1, 3


class Xla:
    """Calls the gates' prepare and execute stages as XLA runs one execution after another."""

    def __init__(self, lib):
        self.lib, self.run, self.errors = lib, 0, []
        self._keep = [QUERY(self._run_id), QUERY(self._stream), ERROR(self._error)]
        self.api = _Api(ctypes.sizeof(_Api))
        self.api.functions[16], self.api.functions[4], self.api.functions[0] = (
            ctypes.cast(f, ctypes.c_void_p) for f in self._keep)

    def _run_id(self, args):
        args.contents.value = self.run
        return None

    def _stream(self, args):
        args.contents.value = None
        return None

    def _error(self, args):
        self.errors.append(args.contents.message.decode())
        return 1  # any non-null pointer: an error

    def execution(self, gates, executed=None):
        """One execution of `gates` (True: an anchor, False: nested, None: passed); `executed`: the
        indices that run (control flow)."""
        self.run += 1
        waited = self.waited()
        for anchor in gates:
            self._call(anchor, PREPARE)
        results = [self._call(gates[i], EXECUTE) for i in (range(len(gates)) if executed is None else executed)]
        return self.waited() - waited, results

    def _call(self, anchor, stage):
        frame = _Frame(ctypes.sizeof(_Frame), None, ctypes.pointer(self.api), None, stage)
        gate = {True: self.lib.iris_fault_gate, False: self.lib.iris_fault_gate_nested,
                None: self.lib.iris_fault_gate_passed}[anchor]
        gate.restype = ctypes.c_void_p
        return gate(ctypes.byref(frame))

    def traits(self, name):
        """What a gate answers to XLA's metadata query (1: it may be captured into a CUDA graph)."""
        from iris_jax.calls import _ffi  # (XLA's structures, as the Python steps read them)

        metadata = _ffi._Metadata(ctypes.sizeof(_ffi._Metadata))
        extension = _ffi._MetadataExtension(_ffi._Extension(ctypes.sizeof(_ffi._MetadataExtension),
                                                            _ffi._METADATA_EXTENSION, None), ctypes.pointer(metadata))
        frame = _Frame(ctypes.sizeof(_Frame), ctypes.addressof(extension), ctypes.pointer(self.api), None, 0)
        getattr(self.lib, name)(ctypes.byref(frame))
        return metadata.traits

    def waited(self):
        return ctypes.c_int64.in_dll(self.lib, "iris_gate_waited").value


def main():
    ctypes.CDLL(_fake_cuda(), mode=ctypes.RTLD_GLOBAL)  # dlopen("libcuda.so.1") finds it by its soname
    from iris_core import faults
    from iris_jax.calls import fault_gate

    fault_gate._recorded = lambda device: RuntimeError(f"a fault on device {device}")
    lib = fault_gate._library()
    assert lib is not None, "the C step did not build"
    page = np.zeros(faults.PAGE_BYTES // 8, np.int64)
    status = np.zeros(1, np.int64)
    lib.iris_gate_set_device(0, page.ctypes.data, status.ctypes.data)
    xla = Xla(lib)

    def say(name, waited, results):
        print(f"{name}: waited {waited}, error {xla.errors[-1] if any(results) else None}", flush=True)

    for name in ("iris_fault_gate", "iris_fault_gate_nested", "iris_fault_gate_passed"):
        print(f"traits of {name}: {xla.traits(name)}", flush=True)
    lib.iris_gate_set_mode(1)  # step
    say("three anchors", *xla.execution([True, True, True]))
    say("two passed, then their anchor", *xla.execution([None, None, True]))
    say("anchor, nested, anchor", *xla.execution([True, False, True]))
    say("anchor then nested", *xla.execution([True, False]))
    say("nested only, twice", *xla.execution([False, False]))
    say("an anchor skipped by control flow", *xla.execution([True, True], executed=[0]))
    say("the next execution after that", *xla.execution([True]))
    page[faults.SLOTS_AT + 3 * faults.SLOT] = faults.TIMEOUT  # a record's code: program 3 gave up
    say("a fault, two anchors", *xla.execution([True, True]))
    say("a fault, a passed gate and its anchor", *xla.execution([None, True]))
    say("a fault stays until check_faults takes it", *xla.execution([True]))
    page[faults.SLOTS_AT + 3 * faults.SLOT] = 0
    status[0] = 1 << 60  # a refused access in the heap's status word
    say("a refused access", *xla.execution([True]))
    say("a refused access is reported once", *xla.execution([True]))  # the gate cleared the status word
    lib.iris_gate_set_mode(2)  # call
    say("call mode, three anchors", *xla.execution([True, True, True]))
    lib.iris_gate_set_device(0, None, 0)
    say("no runtime", *xla.execution([True]))


if __name__ == "__main__":
    sys.exit(main())
