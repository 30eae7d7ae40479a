//go:build linux && (amd64 || arm64)

package dlpack

import (
	"bufio"
	"fmt"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"github.com/ebitengine/purego"
	"golang.org/x/sys/unix"
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

// Foreign addresses are kept as uintptr throughout: a Go pointer (or a
// []byte) made from an address a producer gave could point into the Go
// heap's range, where the garbage collector would take it for one of its
// own objects.

// readMem copies len(dst) bytes at addr, memory a foreign producer claims
// is there, into dst through the kernel, which reports an unmapped address
// as EFAULT where a Go load would crash the process: process_vm_readv, or
// where that is refused (seccomp profiles, emulators), a pipe.
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
	local := []unix.Iovec{{Base: &dst[0]}}
	local[0].SetLen(len(dst))
	remote := []unix.RemoteIovec{{Base: addr, Len: len(dst)}}
	n, err := unix.ProcessVMReadv(os.Getpid(), local, remote, 0)
	switch {
	case err == nil && n == len(dst):
		return nil
	case err == nil:
		return syscall.EFAULT // a short read: the range ends in unmapped memory
	case err == unix.ENOSYS || err == unix.EPERM:
		return pipeRead(dst, addr)
	}
	return err
}

// forcePipe makes readMem's tests take the pipe path.
var forcePipe = false

// probe is a pipe kept for the life of the process: the kernel copies
// bytes written into it as a load from user space would, and fails the
// write with EFAULT where such a load would fault. mu serializes its
// users, each of which drains what it wrote.
var probe struct {
	once sync.Once
	mu   sync.Mutex
	fds  [2]int
	err  error
}

func probePipe() error {
	probe.once.Do(func() { probe.err = unix.Pipe2(probe.fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK) })
	return probe.err
}

// pipeRead is readMem through the probe pipe.
func pipeRead(dst []byte, addr uintptr) error {
	if err := probePipe(); err != nil {
		return err
	}
	probe.mu.Lock()
	defer probe.mu.Unlock()
	for len(dst) > 0 {
		chunk := min(len(dst), 4096) // a pipe holds at least a page
		n, _, errno := unix.Syscall(unix.SYS_WRITE, uintptr(probe.fds[1]), addr, uintptr(chunk))
		if errno != 0 {
			return errno
		}
		if m, err := unix.Read(probe.fds[0], dst[:n]); err != nil || m != int(n) {
			return syscall.EIO
		}
		if int(n) < chunk {
			return syscall.EFAULT
		}
		dst, addr = dst[n:], addr+n
	}
	return nil
}

// iovec is struct iovec with the base as an integer (see above).
type iovec struct {
	base uintptr
	len  uintptr
}

// probeBatch is how many pages one writev probes: 1024 is IOV_MAX, and
// 1024 bytes fit the smallest pipe buffer (one page).
const probeBatch = 1024

// readablePages reports whether a load from every page of [addr, addr+n)
// succeeds, without making one from Go: it writes one byte of each page
// into the probe pipe, probeBatch pages a writev, and reads them back. The
// kernel copies them as a user-space load would, so it fails with EFAULT
// exactly where a load would fault: unmapped pages, PROT_NONE guard pages,
// and file pages past the end of their file (SIGBUS for a load). A batch
// fails as a whole; its pages are then probed one by one to name the
// first. (Not process_vm_readv: that pins the pages, and refuses mappings
// of device memory that loads read.) Every page of the range is faulted
// in, as the first use of the tensor would.
func readablePages(addr, n uintptr) error {
	if n == 0 {
		return nil
	}
	end := addr + n
	if end < addr {
		return &pageError{addr: addr, err: syscall.EFAULT}
	}
	if err := probePipe(); err != nil {
		return err
	}
	page := uintptr(os.Getpagesize())
	var iov [probeBatch]iovec
	var sink [probeBatch]byte
	probe.mu.Lock()
	defer probe.mu.Unlock()
	for a := addr; a < end; {
		k := 0
		for k < probeBatch && a < end {
			iov[k] = iovec{base: a, len: 1}
			k++
			next := a&^(page-1) + page
			if next <= a { // a is in the last page of the address space
				a = end
				break
			}
			a = next
		}
		// A pipe takes a write a pipe page at a time: one fault fails the
		// whole batch. Then find the page, one write each.
		err := probeWrite(sink[:], unix.SYS_WRITEV, uintptr(unsafe.Pointer(&iov[0])), k)
		if err == nil {
			continue
		}
		batchErr, ok := err.(syscall.Errno)
		if !ok {
			return err
		}
		for _, v := range iov[:k] {
			if err := probeWrite(sink[:], unix.SYS_WRITE, v.base, 1); err != nil {
				if errno, ok := err.(syscall.Errno); ok {
					return &pageError{addr: v.base, err: errno}
				}
				return err
			}
		}
		return &pageError{addr: iov[0].base, err: batchErr} // failed as a batch, not page by page
	}
	return nil
}

// probeWrite makes the probe's write system call trap (write or writev)
// of k bytes from arg, and drains what it wrote into sink. A write that
// faults, or falls short, is a syscall.Errno; a failure to drain is not.
func probeWrite(sink []byte, trap, arg uintptr, k int) error {
	w, _, errno := unix.Syscall(trap, uintptr(probe.fds[1]), arg, uintptr(k))
	if errno == 0 && w > 0 {
		if m, err := unix.Read(probe.fds[0], sink[:w]); err != nil || m != int(w) {
			return fmt.Errorf("draining the probe pipe: %d of %d bytes (%v)", m, w, err)
		}
	}
	switch {
	case errno != 0:
		return errno
	case int(w) != k:
		return syscall.EFAULT
	}
	return nil
}

// mapsPath is the file mappingsAllow reads; tests point it elsewhere.
var mapsPath = "/proc/self/maps"

// mappingsAllow reports whether every byte of [addr, addr+n) lies in a
// mapping of this process that has the permissions need, from
// /proc/self/maps: the one way to learn a page's protection without
// touching it. It stops at the first mapping past the range. An error
// matching errNoMaps says the file could not be read or parsed, so
// nothing is known.
func mappingsAllow(addr, n uintptr, need perm) error {
	f, err := os.Open(mapsPath)
	if err != nil {
		return fmt.Errorf("%w (%v)", errNoMaps, err)
	}
	defer f.Close()
	return coverRange(bufio.NewReaderSize(f, 4096), addr, n, need)
}
