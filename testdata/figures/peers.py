"""The Python peers of BENCHMARKS.md: one allocate + free pair of CuPy's,
PyTorch's and cuda.core's allocators, in nanoseconds, on device 0.

Run it right after `cudamem bench` on the same machine, so that both sets
of figures come from one run of the machine. Each measurement warms up
with 1,000 pairs, then times N pairs (100,000 by default; the first
argument scales it) with time.perf_counter_ns and synchronizes the device
at the end, inside the timed span, as cudamem bench does. A peer that is
not installed prints a SKIP line. Output, one line per measurement:

    peer NAME SIZE NS_PER_PAIR
"""

import sys
import time

SCALE = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
N = max(1000, int(100_000 * SCALE))


def pair_ns(fn, sync, n=N):
    for _ in range(1000):
        fn()
    sync()
    t0 = time.perf_counter_ns()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter_ns() - t0) / n


def report(name, size, fn, sync, n=N):
    try:
        print(f"peer {name} {size} {pair_ns(fn, sync, n):.1f}", flush=True)
    except Exception as e:  # noqa: BLE001 - report and go on with the others
        print(f"SKIP {name} {size}: {e!r}", flush=True)


try:
    import cupy

    pool = cupy.cuda.MemoryPool()
    pinned = cupy.cuda.PinnedMemoryPool()
    sync = cupy.cuda.runtime.deviceSynchronize
    for size in (256, 1 << 20, 64 << 20):
        report("cupy.MemoryPool", size, lambda size=size: pool.malloc(size), sync)
    report("cupy.PinnedMemoryPool", 1 << 20, lambda: pinned.malloc(1 << 20), sync)
except Exception as e:  # noqa: BLE001
    print(f"SKIP cupy: {e!r}", flush=True)

try:
    import torch

    sync = torch.cuda.synchronize
    for size in (256, 1 << 20, 64 << 20):
        report("torch.empty", size, lambda size=size: torch.empty(size, dtype=torch.uint8, device="cuda:0"), sync)
    report("torch.empty_pinned", 1 << 20, lambda: torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True), sync)
except Exception as e:  # noqa: BLE001
    print(f"SKIP torch: {e!r}", flush=True)

try:
    try:
        import cuda.core as cc

        if not hasattr(cc, "Device"):
            raise ImportError("no cuda.core.Device")
    except ImportError:
        import cuda.core.experimental as cc

    dev = cc.Device(0)
    dev.set_current()
    stream = dev.create_stream()

    def mr_pair(mr, size):
        def fn():
            mr.allocate(size, stream=stream).close(stream)

        return fn

    def make(name, ctor):
        try:
            return ctor()
        except Exception as e:  # noqa: BLE001
            print(f"SKIP {name}: {e!r}", flush=True)
            return None

    device_mr = make("cuda.core.DeviceMemoryResource", lambda: dev.memory_resource)  # the device's own pool
    pinned_mr = make("cuda.core.PinnedMemoryResource", lambda: cc.PinnedMemoryResource())
    virtual_mr = make("cuda.core.VirtualMemoryResource", lambda: cc.VirtualMemoryResource(dev))
    if device_mr is not None:
        for size in (256, 1 << 20, 64 << 20):
            report("cuda.core.DeviceMemoryResource", size, mr_pair(device_mr, size), stream.sync)
    if pinned_mr is not None:
        report("cuda.core.PinnedMemoryResource", 1 << 20, mr_pair(pinned_mr, 1 << 20), stream.sync)
    if virtual_mr is not None:
        report("cuda.core.VirtualMemoryResource", 2 << 20, mr_pair(virtual_mr, 2 << 20), stream.sync, n=max(1000, N // 10))
except Exception as e:  # noqa: BLE001
    print(f"SKIP cuda.core: {e!r}", flush=True)
