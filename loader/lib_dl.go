//go:build linux && (amd64 || arm64)

package loader

import (
	"fmt"
	"runtime"

	"github.com/ebitengine/purego"
)

var defaultPaths = []string{"libcuda.so.1", "libcuda.so", "/usr/lib/wsl/lib/libcuda.so.1"}

const noDriverReason = "no library paths to try"

// Library is a shared library opened with dlopen.
type Library struct {
	handle uintptr
	path   string
}

// OpenLibrary dlopens path. The error carries dlerror's explanation.
func OpenLibrary(path string) (*Library, error) {
	// dlerror's message is per thread: keep dlopen and dlerror on one.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("dlopen: %w", err)
	}
	return &Library{handle: h, path: path}, nil
}

// Path is the path the library was opened with.
func (l *Library) Path() string { return l.path }

// Lookup finds a symbol with dlsym.
func (l *Library) Lookup(name string) (Proc, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p, err := purego.Dlsym(l.handle, name)
	if err != nil || p == 0 {
		return Proc{name: name}, fmt.Errorf("%s: %w (%v)", name, errNoSymbol, err)
	}
	return Proc{addr: p, name: name}, nil
}

// Close dlcloses the library. Procs from it must not be called afterwards.
func (l *Library) Close() error {
	if l.handle == 0 {
		return nil
	}
	err := purego.Dlclose(l.handle)
	l.handle = 0
	return err
}
