//go:build linux && (amd64 || arm64)

package loader

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/ebitengine/purego"
)

var defaultPaths = []string{"libcuda.so.1", "libcuda.so", "/usr/lib/wsl/lib/libcuda.so.1"}

const noDriverReason = "no library paths to try"

// Library is a shared library opened with dlopen. It is safe for
// concurrent use. A nil or zero Library (not from OpenLibrary) refuses
// every call with ErrInvalidArgument; a closed one with ErrClosed. Neither
// ever reaches dlsym, where a zero handle would mean "search every loaded
// library".
type Library struct {
	mu     sync.RWMutex
	handle uintptr
	path   string
	closed bool
}

// OpenLibrary dlopens path. The error carries dlerror's explanation.
func OpenLibrary(path string) (*Library, error) {
	if path == "" {
		// dlopen("") returns the main program, not a library.
		return nil, fmt.Errorf("dlopen: %w: empty path", ErrInvalidArgument)
	}
	// dlerror's message is per thread: keep dlopen and dlerror on one.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	h, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("dlopen: %w", err)
	}
	return &Library{handle: h, path: path}, nil
}

// Path is the path the library was opened with ("" for a nil Library).
func (l *Library) Path() string {
	if l == nil {
		return ""
	}
	return l.path
}

// Lookup finds a symbol with dlsym.
func (l *Library) Lookup(name string) (Proc, error) {
	if l == nil {
		return Proc{name: name}, fmt.Errorf("Library.Lookup %s: %w: nil Library", name, ErrInvalidArgument)
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	switch {
	case l.closed:
		return Proc{name: name}, fmt.Errorf("Library.Lookup %s: %w", name, ErrClosed)
	case l.handle == 0:
		return Proc{name: name}, fmt.Errorf("Library.Lookup %s: %w: zero Library (use OpenLibrary)", name, ErrInvalidArgument)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	p, err := purego.Dlsym(l.handle, name)
	if err != nil || p == 0 {
		return Proc{name: name}, fmt.Errorf("%s: %w (%v)", name, errNoSymbol, err)
	}
	return Proc{addr: p, name: name}, nil
}

// Close dlcloses the library. It is idempotent, and does nothing on a nil
// or zero Library. Procs from it must not be called afterwards.
func (l *Library) Close() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || l.handle == 0 {
		return nil
	}
	err := purego.Dlclose(l.handle)
	l.handle = 0
	l.closed = true
	return err
}
