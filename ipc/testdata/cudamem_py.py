"""Helpers for ipc's Python interop tests (python_gpu_test.go).

Driver calls go through ctypes on libcuda.so.1, so the scripts depend on
cuda.core (or torch) only for what they test. Exit status 77 means "skip":
a module the test needs is missing or unusable.
"""

import ctypes
import importlib
import sys

SKIP = 77


def skip(why):
    print("SKIP:", why, flush=True)
    sys.exit(SKIP)


def fail(why):
    print("FAIL:", why, flush=True)
    sys.exit(1)


def pattern(n, seed):
    """The bytes cudatest.Pattern makes: byte i is (i*31 + seed) mod 256."""
    return bytes(((i * 31 + seed) & 0xFF) for i in range(n))


def check_pattern(got, seed, what):
    want = pattern(len(got), seed)
    if got != want:
        i = next(i for i in range(len(got)) if got[i] != want[i])
        fail(f"{what}: byte {i} of {len(got)} is {got[i]:#x}, want {want[i]:#x} (seed {seed})")


class Driver:
    """The few CUDA driver calls the scripts make, through ctypes."""

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            fail(f"no CUDA driver: {e}")
        self.check("cuInit", self.lib.cuInit(0))

    def check(self, what, r):
        if r != 0:
            fail(f"{what}: CUresult {r}")

    def make_current(self, ordinal):
        """Retain device ordinal's primary context and make it current on
        this thread (what cuda.core and torch use too)."""
        dev = ctypes.c_int()
        self.check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(dev), ordinal))
        ctx = ctypes.c_void_p()
        self.check("cuDevicePrimaryCtxRetain", self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev))
        self.check("cuCtxSetCurrent", self.lib.cuCtxSetCurrent(ctx))

    def sync(self):
        self.check("cuCtxSynchronize", self.lib.cuCtxSynchronize())

    def read(self, ptr, n):
        buf = ctypes.create_string_buffer(n)
        self.check("cuMemcpyDtoH", self.lib.cuMemcpyDtoH_v2(buf, ctypes.c_uint64(ptr), ctypes.c_size_t(n)))
        return buf.raw

    def write(self, ptr, data):
        buf = ctypes.create_string_buffer(data, len(data))
        self.check("cuMemcpyHtoD", self.lib.cuMemcpyHtoD_v2(ctypes.c_uint64(ptr), buf, ctypes.c_size_t(len(data))))

    def ipc_open(self, handle):
        """cuIpcOpenMemHandle of 64 handle bytes; returns the pointer."""
        if len(handle) != 64:
            fail(f"IPC handle of {len(handle)} bytes")

        class Handle(ctypes.Structure):
            _fields_ = [("reserved", ctypes.c_char * 64)]

        h = Handle()
        ctypes.memmove(ctypes.byref(h), handle, 64)
        ptr = ctypes.c_uint64()
        # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
        self.check("cuIpcOpenMemHandle", self.lib.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), h, ctypes.c_uint(1)))
        return ptr.value

    def ipc_close(self, ptr):
        self.check("cuIpcCloseMemHandle", self.lib.cuIpcCloseMemHandle(ctypes.c_uint64(ptr)))


def cuda_core():
    """The cuda.core module (cuda.core, else cuda.core.experimental), or
    skip."""
    for name in ("cuda.core", "cuda.core.experimental"):
        try:
            m = importlib.import_module(name)
        except Exception:  # noqa: BLE001 - any import failure means "missing"
            continue
        if hasattr(m, "DeviceMemoryResource") and hasattr(m, "Device"):
            return m
    skip("cuda.core is not importable")


def core_attr(core, name):
    """A cuda.core class wherever this version keeps it."""
    for mod in (core.__name__, core.__name__ + "._memory", core.__name__ + "._memory._ipc",
                "cuda.core._memory", "cuda.core._memory._ipc", "cuda.core.experimental._memory",
                "cuda.core.experimental._memory._ipc"):
        try:
            m = importlib.import_module(mod)
        except Exception:  # noqa: BLE001
            continue
        if hasattr(m, name):
            return getattr(m, name)
    fail(f"cuda.core has no {name}")


def allocation_handle(mr):
    """The pool's IPCAllocationHandle (a method in older cuda.core, a
    property in newer)."""
    get = getattr(mr, "get_allocation_handle", None)
    return get() if callable(get) else mr.allocation_handle


def ipc_descriptor(buf):
    get = getattr(buf, "get_ipc_descriptor", None)
    return get() if callable(get) else buf.ipc_descriptor


def descriptor_parts(desc):
    """(export data, size) of an IPCBufferDescriptor, through its pickle
    form (its fields are not Python attributes)."""
    args = desc.__reduce__()[1]
    return bytes(args[0]), int(args[1])


def torch_or_skip():
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        skip(f"torch is not importable: {e}")
    if not torch.cuda.is_available():
        skip("torch has no CUDA")
    return torch


class CAI:
    """An object exposing device memory through __cuda_array_interface__,
    which torch.as_tensor takes without copying."""

    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {
            "shape": (n,),
            "typestr": "|u1",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
        }
