"""Go -> PyTorch: open memory cudamem described with ipc.ExportLegacy (a
legacy IPC handle of a cuMemAlloc allocation, an offset and a size), hand
it to PyTorch through __cuda_array_interface__ (no copy), check Go's data
with torch and overwrite it from torch."""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import cudamem_py as cm  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--handle", required=True)
ap.add_argument("--offset", type=int, required=True)
ap.add_argument("--size", type=int, required=True)
ap.add_argument("--seed", type=int, required=True)
ap.add_argument("--newseed", type=int, required=True)
ap.add_argument("--device", type=int, default=0)
a = ap.parse_args()

torch = cm.torch_or_skip()
dev = torch.device(f"cuda:{a.device}")
torch.cuda.init()
torch.empty(1, device=dev)  # the primary context exists and is current
drv = cm.Driver()
drv.make_current(a.device)
base = drv.ipc_open(bytes.fromhex(a.handle))
ptr = base + a.offset
t = torch.as_tensor(cm.CAI(ptr, a.size), device=dev)
if t.data_ptr() != ptr:
    cm.fail(f"torch copied the memory (data_ptr {t.data_ptr():#x}, mapping {ptr:#x})")
idx = torch.arange(a.size, device=dev, dtype=torch.int64)
bad = int((t != ((idx * 31 + a.seed) % 256).to(torch.uint8)).sum().item())
if bad:
    cm.fail(f"torch sees {bad} of {a.size} bytes differ from Go's data")
t.copy_(((idx * 31 + a.newseed) % 256).to(torch.uint8))
torch.cuda.synchronize(dev)
del t
drv.ipc_close(base)
print("OK", flush=True)
