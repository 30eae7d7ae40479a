"""PyTorch -> Go: share a CUDA tensor's storage the way torch.multiprocessing
does (UntypedStorage._share_cuda_(): a cudaIpcMemHandle of the caching
allocator's segment, the storage's offset in it and its size, the
reference counter's file and index, the event), as one JSON line on
stdout; wait for "done" on stdin (Go has closed its Buffer by then); check
what Go wrote, that Go released the share (its counter is 0), and that
once the tensor is dropped torch's memory is back where it started.
Whether torch warned at exit that shared tensors were not released is
the Go test's to check, on this process's stderr."""

import argparse
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(__file__))
import cudamem_py as cm  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--size", type=int, required=True)
ap.add_argument("--seed", type=int, required=True)
ap.add_argument("--newseed", type=int, required=True)
ap.add_argument("--device", type=int, default=0)
a = ap.parse_args()

torch = cm.torch_or_skip()
dev = torch.device(f"cuda:{a.device}")
torch.cuda.init()
baseline = torch.cuda.memory_allocated(dev)
# Another block first, so the shared storage likely sits at a non-zero
# offset of its segment.
pad = torch.empty(4096 + 512, dtype=torch.uint8, device=dev)
idx = torch.arange(a.size, device=dev, dtype=torch.int64)
t = ((idx * 31 + a.seed) % 256).to(torch.uint8)
del idx
st = t.untyped_storage()
info = st._share_cuda_()
# (device, handle, storage_size_bytes, storage_offset_bytes,
#  ref_counter_handle, ref_counter_offset, event_handle, event_sync_required)
handle, size, offset = bytes(info[1]), info[2], info[3]
ref_name, ref_off = bytes(info[4]).decode(), int(info[5])
event, event_sync = bytes(info[6]), bool(info[7])
# A bare 64-byte cudaIpcMemHandle_t (older torch), or version byte, type
# byte and payload; type 'e' is an expandable segment, not legacy IPC.
if len(handle) > 64 and handle[1] == ord("e"):
    cm.skip("torch shared an expandable-segments handle (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), not legacy IPC")

# The counter file, as Go reads it: a 64-byte header, then 8-byte
# counters; this share's is 1 until a consumer releases it.
ref_path = "/dev/shm" + ref_name


def counter():
    with open(ref_path, "rb") as f:
        f.seek(64 + 8 * ref_off)
        return struct.unpack("=q", f.read(8))[0]


if counter() != 1:
    cm.fail(f"the share's counter ({ref_path}, index {ref_off}) reads {counter()} before Go opened it, want 1: torch's file layout is not what ipc expects")
print(json.dumps({"handle": handle.hex(), "offset": int(offset), "size": int(size),
                  "ref_counter": ref_name, "ref_counter_offset": ref_off,
                  "event": event.hex(), "event_sync": event_sync}), flush=True)
if sys.stdin.readline().strip() != "done":
    cm.fail("Go did not say done")
if counter() != 0:
    cm.fail(f"Go closed its Buffer, but the share's counter reads {counter()}, want 0 (not released)")
want = ((torch.arange(a.size, device=dev, dtype=torch.int64) * 31 + a.newseed) % 256).to(torch.uint8)
bad = int((t != want).sum().item())
if bad:
    cm.fail(f"{bad} of {a.size} bytes of the tensor differ from what Go wrote")
del t, st, want, pad
torch.cuda.synchronize(dev)
torch.cuda.ipc_collect()
left = torch.cuda.memory_allocated(dev) - baseline
if left != 0:
    cm.fail(f"{left} bytes still allocated after the shared tensor was dropped (torch keeps a share that was not released)")
print("OK", flush=True)
