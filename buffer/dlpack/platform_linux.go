//go:build linux && (amd64 || arm64)

package dlpack

import (
	"sync"
	"syscall"
	"unsafe"

	"github.com/ebitengine/purego"
)

// supported: purego.NewCallback makes C-callable functions here without
// cgo (purego's own runtime shim lets C threads the Go runtime never saw
// call in), and the loader can call C function pointers.
const supported = true

// deleterAddr is the C function pointer of every exported tensor's
// deleter, made once: purego callbacks are a fixed number of slots that
// are never given back, so one Go function serves every tensor, and
// tells them apart by address (see takeExport).
var deleterAddr = sync.OnceValue(func() uintptr {
	return purego.NewCallback(func(self uintptr) { deleted(self) })
})

type iovec struct {
	base uintptr
	len  uintptr
}

// readMem copies len(dst) bytes at addr, memory a foreign producer claims
// is there, into dst without touching it from Go: through the kernel,
// which reports an unmapped address as EFAULT where a Go load would
// crash the process. process_vm_readv on this process does it in one
// call; where it is refused (seccomp profiles, emulators), writing the
// bytes into a pipe and reading them back does the same.
func readMem(dst []byte, addr uintptr) error {
	if len(dst) == 0 {
		return nil
	}
	if addr+uintptr(len(dst)) < addr {
		return syscall.EFAULT
	}
	if forcePipe {
		return pipeRead(dst, addr)
	}
	local := iovec{base: uintptr(unsafe.Pointer(&dst[0])), len: uintptr(len(dst))}
	remote := iovec{base: addr, len: uintptr(len(dst))}
	n, _, errno := syscall.Syscall6(sysProcessVMReadv, uintptr(syscall.Getpid()),
		uintptr(unsafe.Pointer(&local)), 1, uintptr(unsafe.Pointer(&remote)), 1, 0)
	switch {
	case errno == 0 && int(n) == len(dst):
		return nil
	case errno == 0:
		return syscall.EFAULT // a short read: the range ends in unmapped memory
	case errno == syscall.ENOSYS || errno == syscall.EPERM:
		return pipeRead(dst, addr)
	}
	return errno
}

// forcePipe makes readMem's tests take the pipe path.
var forcePipe = false

var probe struct {
	once sync.Once
	mu   sync.Mutex
	fds  [2]int
	err  error
}

// pipeRead is readMem through a pipe kept for the life of the process.
func pipeRead(dst []byte, addr uintptr) error {
	probe.once.Do(func() { probe.err = syscall.Pipe2(probe.fds[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK) })
	if probe.err != nil {
		return probe.err
	}
	probe.mu.Lock()
	defer probe.mu.Unlock()
	for len(dst) > 0 {
		chunk := min(len(dst), 4096) // a pipe holds at least a page
		n, _, errno := syscall.Syscall(syscall.SYS_WRITE, uintptr(probe.fds[1]), addr, uintptr(chunk))
		if errno != 0 {
			return errno
		}
		if m, err := syscall.Read(probe.fds[0], dst[:n]); err != nil || m != int(n) {
			return syscall.EIO
		}
		if int(n) < chunk {
			return syscall.EFAULT
		}
		dst, addr = dst[n:], addr+n
	}
	return nil
}

// mappedRange reports whether every page of [addr, addr+n) is mapped,
// without touching the memory: mincore fails with ENOMEM at a page that is
// not. It asks for at most 4096 pages a call, so a hostile size costs a
// bounded buffer and stops at the first unmapped page.
func mappedRange(addr, n uintptr) error {
	if n == 0 {
		return nil
	}
	end := addr + n
	if end < addr {
		return syscall.EINVAL
	}
	page := uintptr(syscall.Getpagesize())
	const chunk = 4096 // pages a call
	var vec [chunk]byte
	for a := addr &^ (page - 1); a < end; {
		l := min(end-a, chunk*page)
		if _, _, e := syscall.Syscall(syscall.SYS_MINCORE, a, l, uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
			return e
		}
		a += l
	}
	return nil
}
