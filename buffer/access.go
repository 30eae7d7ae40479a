package buffer

import (
	"github.com/cudamem/cudamem/cuda"
)

// props is where a buffer's memory lives and who can touch it.
type props struct {
	device  int  // device ordinal, -1 for host memory or memory the driver does not know
	devAcc  bool // kernels can use it
	hostAcc bool // the CPU can use it
}

// hostOnly reports memory that the CPU can use and no device can: Go or
// plain host memory behind a resource that says so. Copies to and from it
// are CPU moves that need no stream and no driver.
func (p props) hostOnly() bool { return p.hostAcc && !p.devAcc }

// props asks the resource, or for borrowed memory the driver (once per
// allocation). Call it within a call on b: Close clears an owner's home.
func (b *Buffer) props() props {
	if mr := b.homeOf().mr; mr != nil {
		return props{device: mr.DeviceID(), devAcc: mr.DeviceAccessible(), hostAcc: mr.HostAccessible()}
	}
	info, err := b.rootOf().pointerInfo()
	if err != nil {
		return props{device: -1}
	}
	host := info.Type == cuda.MemoryTypeHost && !info.Managed
	p := props{device: info.Device, devAcc: true, hostAcc: host || info.Managed}
	if host {
		p.device = -1
	}
	return p
}

// openProps is props for the accessors: those of memory no one can reach
// once the buffer is closed.
func (b *Buffer) openProps() props {
	if b == nil || !b.use() {
		return props{device: -1}
	}
	defer b.release()
	return b.props()
}

// DeviceID is the ordinal of the device the memory belongs to, or -1 for
// host memory (pinned memory is bound to no device), for memory the driver
// does not know, and once the buffer is closed. Owned buffers ask their
// resource; borrowed ones ask the driver (cuPointerGetAttribute, once).
func (b *Buffer) DeviceID() int { return b.openProps().device }

// DeviceAccessible reports whether kernels can use the memory: device,
// pinned and managed memory can. It is false once the buffer is closed.
func (b *Buffer) DeviceAccessible() bool { return b.openProps().devAcc }

// HostAccessible reports whether the CPU can use the memory directly
// (see [Buffer.Bytes]): pinned host and managed memory can, device memory
// cannot. It is false once the buffer is closed.
func (b *Buffer) HostAccessible() bool { return b.openProps().hostAcc }

// Device returns the device the memory belongs to. Host memory belongs to
// none: that is an error matching [cuda.ErrInvalidArgument].
func (b *Buffer) Device() (*cuda.Device, error) {
	const op = "Buffer.Device"
	ptr, err := b.acquire(op)
	if err != nil {
		return nil, err
	}
	defer b.release()
	id := b.props().device
	if id < 0 {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "the memory at %#x belongs to no device (host memory, or memory the driver does not know)", uint64(ptr))
	}
	return cuda.GetDevice(id)
}

// streamFor resolves a stream argument: s itself if not nil, else the
// buffer's allocation stream, else the legacy default stream of the
// buffer's device (of device 0 for memory bound to no device). A zero
// cuda.Stream, given or recorded at allocation, is an error matching
// cuda.ErrInvalidArgument.
func (b *Buffer) streamFor(op string, s *cuda.Stream) (*cuda.Stream, error) {
	if s == nil {
		s = b.homeOf().stream
	}
	var d *cuda.Device
	if s == nil {
		var err error
		if d, err = cuda.GetDevice(max(b.props().device, 0)); err != nil {
			return nil, err
		}
	}
	return d.ResolveStream(op, s, false)
}

// pinnedHost reports whether the memory is page-locked host memory that is
// not managed (cuMemHostAlloc, cuMemAllocHost, cuMemHostRegister, a host
// pool): host copies to and from it are plain memory moves once the stream
// has drained. Call it only after streamFor succeeded, so that buffers
// whose resource names no real device never reach the driver.
func (b *Buffer) pinnedHost() bool {
	p := b.props()
	if !p.hostAcc {
		return false
	}
	info, err := b.rootOf().pointerInfo()
	if err != nil {
		// Host-accessible memory the driver does not know: plain host
		// memory, unless its resource claims kernels can reach it.
		return !p.devAcc
	}
	return info.Type == cuda.MemoryTypeHost && !info.Managed
}

// pointerInfo returns the driver's description of the allocation (r is a
// root). Only an answer is kept: a failed query (no driver yet, a
// transient error) is asked again next time, so that one failure does not
// decide the buffer's accessibility for good.
func (r *Buffer) pointerInfo() (cuda.PointerInfo, error) {
	if x := r.ext.Load(); x != nil {
		if pi := x.info.Load(); pi != nil {
			return *pi, nil
		}
	}
	info, err := cuda.QueryPointer(r.ptr)
	if err != nil {
		return cuda.PointerInfo{}, err
	}
	r.makeExt().info.Store(&info)
	return info, nil
}
