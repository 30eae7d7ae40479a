"""PyTorch -> Go: share a CUDA tensor's storage the way torch.multiprocessing
does (UntypedStorage._share_cuda_(): a cudaIpcMemHandle of the caching
allocator's segment, the storage's offset in it and its size), as one JSON
line on stdout; wait for "done" on stdin; check what Go wrote."""

import argparse
import json
import os
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
# Another block first, so the shared storage likely sits at a non-zero
# offset of its segment.
pad = torch.empty(4096 + 512, dtype=torch.uint8, device=dev)
idx = torch.arange(a.size, device=dev, dtype=torch.int64)
t = ((idx * 31 + a.seed) % 256).to(torch.uint8)
torch.cuda.synchronize(dev)
st = t.untyped_storage()
info = st._share_cuda_()
# (device, handle, storage_size_bytes, storage_offset_bytes,
#  ref_counter_handle, ref_counter_offset, event_handle, event_sync_required)
handle, size, offset = bytes(info[1]), info[2], info[3]
# A bare 64-byte cudaIpcMemHandle_t (older torch), or version byte, type
# byte and payload; type 'e' is an expandable segment, not legacy IPC.
if len(handle) > 64 and handle[1] == ord("e"):
    cm.skip("torch shared an expandable-segments handle (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), not legacy IPC")
print(json.dumps({"handle": handle.hex(), "offset": int(offset), "size": int(size)}), flush=True)
if sys.stdin.readline().strip() != "done":
    cm.fail("Go did not say done")
want = ((idx * 31 + a.newseed) % 256).to(torch.uint8)
bad = int((t != want).sum().item())
if bad:
    cm.fail(f"{bad} of {a.size} bytes of the tensor differ from what Go wrote")
del pad
print("OK", flush=True)
