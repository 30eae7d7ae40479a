"""Python -> Go: make an IPC-enabled cuda.core pool and a buffer with
data in it; send the pool's fd (SCM_RIGHTS) and, as one JSON message,
its UUID, the buffer's export data (hex) and size over the Unix socket
--sock; wait for Go's "done"; check the data Go wrote. With --no-uuid the
UUID is left out (a bare fd)."""

import argparse
import array
import json
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(__file__))
import cudamem_py as cm  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--sock", type=int, required=True)
ap.add_argument("--size", type=int, required=True)
ap.add_argument("--seed", type=int, required=True)
ap.add_argument("--newseed", type=int, required=True)
ap.add_argument("--device", type=int, default=0)
ap.add_argument("--no-uuid", action="store_true")
a = ap.parse_args()

core = cm.cuda_core()
drv = cm.Driver()
dev = core.Device(a.device)
dev.set_current()
drv.make_current(a.device)
stream = dev.default_stream

DMR = cm.core_attr(core, "DeviceMemoryResource")
Options = cm.core_attr(core, "DeviceMemoryResourceOptions")
try:
    mr = DMR(a.device, options=Options(ipc_enabled=True, max_size=64 << 20))
except Exception as e:  # noqa: BLE001
    if "not supported" in str(e).lower() or "IPC is not available" in str(e):
        cm.skip(f"IPC pools unsupported here: {e}")
    raise
buf = mr.allocate(a.size, stream=stream)
stream.sync()
ptr = int(buf.handle)
drv.write(ptr, cm.pattern(a.size, a.seed))
drv.sync()

h = cm.allocation_handle(mr)
data, size = cm.descriptor_parts(cm.ipc_descriptor(buf))
msg = {"data": data.hex(), "size": size}
if not a.no_uuid and getattr(h, "uuid", None) is not None:
    msg["uuid"] = str(h.uuid)
sock = socket.socket(fileno=a.sock)
# socket.send_fds (Python 3.9+); the same sendmsg by hand before that.
line = json.dumps(msg).encode() + b"\n"
if hasattr(socket, "send_fds"):
    socket.send_fds(sock, [line], [int(h.handle)])
else:
    sock.sendmsg([line], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [int(h.handle)]))])

reply = b""
while not reply.endswith(b"\n"):
    chunk = sock.recv(64)
    if not chunk:
        cm.fail("Go closed the socket without saying done")
    reply += chunk
if reply.strip() != b"done":
    cm.fail(f"Go said {reply!r}")
cm.check_pattern(drv.read(ptr, a.size), a.newseed, "Go's writes seen from Python")
buf.close(stream=stream)
stream.sync()
print("OK", flush=True)
