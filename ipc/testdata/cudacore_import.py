"""Go -> Python: import a pool cudamem exported (its fd inherited as
--fd, its UUID) and one of its buffers from the raw parts
(Descriptor.ExportData, size), check the data Go wrote, write new data
for Go to check. With --sock, the fd and the parts (one JSON line: uuid,
data, size) arrive instead over the Unix socket inherited as that fd, in
one message as socket.recv_fds reads it (Go's ipc.SendPlain). With --torch,
PyTorch reads and writes the memory (through __cuda_array_interface__)
instead of plain copies."""

import argparse
import array
import json
import os
import socket
import sys
import uuid

sys.path.insert(0, os.path.dirname(__file__))
import cudamem_py as cm  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--fd", type=int, help="the pool's fd")
ap.add_argument("--uuid")
ap.add_argument("--data", help="64 bytes of export data, hex")
ap.add_argument("--size", type=int)
ap.add_argument("--sock", type=int, help="a Unix socket bringing the pool's fd and the rest")
ap.add_argument("--seed", type=int, required=True)
ap.add_argument("--newseed", type=int, required=True)
ap.add_argument("--device", type=int, default=0)
ap.add_argument("--torch", action="store_true")
a = ap.parse_args()


def receive(fd):
    """The message and the one fd Go's ipc.SendPlain sent."""
    sock = socket.socket(fileno=fd)
    if hasattr(socket, "recv_fds"):  # Python 3.9+
        msg, fds, _flags, _addr = socket.recv_fds(sock, 4096, 1)
    else:
        ints = array.array("i")
        msg, anc, _flags, _addr = sock.recvmsg(4096, socket.CMSG_SPACE(ints.itemsize))
        fds = []
        for level, kind, data in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                ints.frombytes(data[: len(data) - len(data) % ints.itemsize])
                fds = list(ints)
    while msg and not msg.endswith(b"\n"):  # the rest of a split message
        more = sock.recv(4096)
        if not more:
            break
        msg += more
    if len(fds) != 1:
        cm.fail(f"{len(fds)} fds with the message, want 1")
    return sock, json.loads(msg), fds[0]


sock = None
if a.sock is not None:
    sock, m, a.fd = receive(a.sock)
    a.uuid, a.data, a.size = m["uuid"], m["data"], int(m["size"])
    print(f"received over the socket: fd {a.fd}, pool {a.uuid}, {a.size} bytes", flush=True)
elif None in (a.fd, a.uuid, a.data, a.size):
    ap.error("give --sock, or all of --fd, --uuid, --data and --size")

core = cm.cuda_core()
torch = cm.torch_or_skip() if a.torch else None
drv = cm.Driver()
dev = core.Device(a.device)
dev.set_current()
drv.make_current(a.device)
stream = dev.default_stream

DMR = cm.core_attr(core, "DeviceMemoryResource")
IPCBufferDescriptor = cm.core_attr(core, "IPCBufferDescriptor")
Buffer = cm.core_attr(core, "Buffer")

# cuda.core dups an int fd and closes its duplicate; the inherited (or
# received) fd is ours to close.
mr = DMR.from_allocation_handle(a.device, a.fd)
os.close(a.fd)
want_uuid = uuid.UUID(a.uuid)
if getattr(mr, "uuid", None) not in (None, want_uuid):
    cm.fail(f"imported pool has UUID {mr.uuid}, want {want_uuid}")
desc = IPCBufferDescriptor._init(bytes.fromhex(a.data), a.size)
buf = Buffer.from_ipc_descriptor(mr, desc, stream=stream)
ptr = int(buf.handle)
if buf.size != a.size:
    cm.fail(f"imported buffer of {buf.size} bytes, want {a.size}")

if torch is None:
    cm.check_pattern(drv.read(ptr, a.size), a.seed, "Go's data seen from Python")
    drv.write(ptr, cm.pattern(a.size, a.newseed))
else:
    t = torch.as_tensor(cm.CAI(ptr, a.size), device=f"cuda:{a.device}")
    if t.data_ptr() != ptr:
        cm.fail(f"torch copied the memory (data_ptr {t.data_ptr():#x}, buffer {ptr:#x})")
    idx = torch.arange(a.size, device=t.device, dtype=torch.int64)
    want = ((idx * 31 + a.seed) % 256).to(torch.uint8)
    bad = int((t != want).sum().item())
    if bad:
        cm.fail(f"torch sees {bad} of {a.size} bytes differ from Go's data")
    t.copy_(((idx * 31 + a.newseed) % 256).to(torch.uint8))
    torch.cuda.synchronize(t.device)
drv.sync()
buf.close(stream=stream)
stream.sync()
close = getattr(mr, "close", None)
if callable(close):
    close()
if sock is not None:
    sock.close()
print("OK", flush=True)
