//go:build windows

package loader

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"unsafe"
)

var defaultPaths = []string{"nvcuda.dll"}

const noDriverReason = "no library paths to try"

// Library is a DLL opened with LoadLibrary.
type Library struct {
	mu   sync.RWMutex // Close waits for Lookups in progress
	dll  *syscall.DLL
	path string
}

// LoadLibraryExW flags (libloaderapi.h).
const (
	loadWithAlteredSearchPath = 0x00000008 // LOAD_WITH_ALTERED_SEARCH_PATH
	loadLibrarySearchSystem32 = 0x00000800 // LOAD_LIBRARY_SEARCH_SYSTEM32
)

// kernel32 is loaded by Go itself at start-up (a known system DLL), so
// loading it by name cannot pick up a planted copy.
var loadLibraryExW = syscall.NewLazyDLL("kernel32.dll").NewProc("LoadLibraryExW")

// OpenLibrary loads the DLL at path. A bare name such as nvcuda.dll is
// loaded from the system directory only (LOAD_LIBRARY_SEARCH_SYSTEM32),
// never from the working directory, the executable's directory or PATH,
// where a planted DLL could be picked up. A path with a directory (from
// CUDAMEM_DRIVER) is made absolute and loaded from there, its own
// dependencies searched from its directory.
func OpenLibrary(path string) (*Library, error) {
	if path == "" {
		return nil, fmt.Errorf("LoadLibrary: %w: empty path", ErrInvalidArgument)
	}
	name, flags := path, uintptr(loadLibrarySearchSystem32)
	if strings.ContainsAny(path, `\/:`) {
		abs, err := filepath.Abs(path)
		if err != nil {
			return nil, fmt.Errorf("LoadLibrary: %s: %w", path, err)
		}
		name, flags = abs, loadWithAlteredSearchPath
	}
	p, err := syscall.UTF16PtrFromString(name)
	if err != nil {
		return nil, fmt.Errorf("LoadLibrary: %s: %w", path, err)
	}
	if err := loadLibraryExW.Find(); err != nil {
		return nil, fmt.Errorf("LoadLibrary: %s: %w", path, err)
	}
	h, _, callErr := loadLibraryExW.Call(uintptr(unsafe.Pointer(p)), 0, flags)
	if h == 0 {
		return nil, fmt.Errorf("LoadLibrary: %s: %w", path, callErr)
	}
	return &Library{dll: &syscall.DLL{Name: name, Handle: syscall.Handle(h)}, path: path}, nil
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
	if l == nil {
		return Proc{name: name}, fmt.Errorf("Library.Lookup %s: %w: nil, zero or closed Library", name, ErrInvalidArgument)
	}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.dll == nil {
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
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dll == nil {
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
