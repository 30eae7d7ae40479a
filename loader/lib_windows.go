//go:build windows

package loader

import (
	"fmt"
	"runtime"
	"syscall"
)

var defaultPaths = []string{"nvcuda.dll"}

const noDriverReason = "no library paths to try"

// MaxArgs is the most integer arguments a call may pass.
const MaxArgs = 16

// Library is a DLL opened with LoadLibrary.
type Library struct {
	dll  *syscall.DLL
	path string
}

// OpenLibrary loads the DLL at path.
func OpenLibrary(path string) (*Library, error) {
	d, err := syscall.LoadDLL(path)
	if err != nil {
		return nil, fmt.Errorf("LoadLibrary: %w", err)
	}
	return &Library{dll: d, path: path}, nil
}

// Path is the path the library was opened with.
func (l *Library) Path() string {
	if l == nil {
		return ""
	}
	return l.path
}

// Lookup finds an exported function. A nil, zero or closed Library refuses.
func (l *Library) Lookup(name string) (Proc, error) {
	if l == nil || l.dll == nil {
		return Proc{name: name}, fmt.Errorf("Library.Lookup %s: %w: nil, zero or closed Library", name, ErrInvalidArgument)
	}
	p, err := l.dll.FindProc(name)
	if err != nil {
		return Proc{name: name}, fmt.Errorf("%s: %w (%v)", name, errNoSymbol, err)
	}
	return Proc{addr: p.Addr(), name: name}, nil
}

// Close frees the DLL.
func (l *Library) Close() error {
	if l == nil || l.dll == nil {
		return nil
	}
	err := l.dll.Release()
	l.dll = nil
	return err
}

// Call calls the entry point; see the linux documentation of Call.
//
//go:nosplit
func (p *Proc) Call(args ...uintptr) uintptr {
	if p == nil || p.addr == 0 || len(args) > MaxArgs {
		return NotFound
	}
	r, _, _ := syscall.SyscallN(p.addr, args...)
	return r
}

// CallCtx is Call with ctx made current on the calling OS thread first.
//
//go:nosplit
func (p *Proc) CallCtx(ctx uintptr, args ...uintptr) uintptr {
	if p == nil || p.addr == 0 || p.setCtx == 0 || len(args) > MaxArgs {
		return NotFound
	}
	runtime.LockOSThread()
	if r, _, _ := syscall.SyscallN(p.setCtx, ctx); int32(r) != 0 {
		runtime.UnlockOSThread()
		return r
	}
	r, _, _ := syscall.SyscallN(p.addr, args...)
	runtime.UnlockOSThread()
	return r
}
