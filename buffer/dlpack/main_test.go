package dlpack_test

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/buffer/dlpack"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/dlpacktest"
)

// clib is the C stand-in for a DLPack consumer and producer, or nil
// without a C compiler.
var clib *dlpacktest.Lib

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dlpack")
	if err != nil {
		panic(err)
	}
	clib, err = dlpacktest.Build(dir)
	switch {
	case errors.Is(err, dlpacktest.ErrNoCompiler) && !dlpacktest.Required():
		fmt.Println("C-side DLPack tests skip:", err)
		clib = nil
	case err != nil && runtime.GOOS == "linux" && (runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64"):
		fmt.Println(err)
		os.Exit(1)
	case err != nil:
		clib = nil
	}
	code := m.Run()
	if code == 0 {
		if n := dlpack.Live(); n != 0 {
			fmt.Fprintf(os.Stderr, "dlpack: %d exports still live after the tests: a test lost a tensor\n", n)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

func needC(t testing.TB) *dlpacktest.Lib {
	t.Helper()
	needSupported(t)
	if clib == nil {
		t.Skip("no C compiler for the DLPack test library (set CUDAMEM_REQUIRE_CC to fail instead)")
	}
	return clib
}

func isSupported() bool {
	return runtime.GOOS == "linux" && (runtime.GOARCH == "amd64" || runtime.GOARCH == "arm64")
}

func needSupported(t testing.TB) {
	t.Helper()
	if !isSupported() {
		t.Skip("DLPack export and import need linux/amd64 or linux/arm64")
	}
}

func addr[T any](p *T) uintptr { return uintptr(unsafe.Pointer(p)) }

// heap is cuda.core's host dummy resource: Go heap memory, host-only, so
// CPU tests can read and write it with no driver. It counts frees.
type heap struct {
	mu    sync.Mutex
	mem   map[cuda.DevicePtr][]byte
	frees int
}

func newHeap() *heap { return &heap{mem: map[cuda.DevicePtr][]byte{}} }

func (m *heap) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	b := make([]byte, size+1)
	p := cuda.DevicePtr(uintptr(unsafe.Pointer(&b[0])))
	m.mu.Lock()
	m.mem[p] = b
	m.mu.Unlock()
	return p, s, nil
}

func (m *heap) Deallocate(p cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.mem[p]; !ok {
		return fmt.Errorf("heap: %#x not allocated here", uint64(p))
	}
	delete(m.mem, p)
	m.frees++
	return nil
}

func (m *heap) freed() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.frees
}

func (m *heap) live() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.mem)
}

func (m *heap) DeviceAccessible() bool { return false }
func (m *heap) HostAccessible() bool   { return true }
func (m *heap) DeviceID() int          { return -1 }

func (m *heap) alloc(t testing.TB, size uint64) *buffer.Buffer {
	t.Helper()
	b, err := buffer.Allocate(m, size, nil)
	require.NoError(t, err)
	return b
}

// access is a resource that only reports accessibility, for the device
// type tests (cuda.core's device, pinned, unified, host and null dummies):
// its addresses are never touched.
type access struct {
	dev, host bool
	id        int
	next      cuda.DevicePtr
}

func (m *access) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	m.next += 0x1000
	return 0x7e57_0000_0000 + m.next, s, nil
}
func (m *access) Deallocate(cuda.DevicePtr, uint64, *cuda.Stream) error { return nil }
func (m *access) DeviceAccessible() bool                                { return m.dev }
func (m *access) HostAccessible() bool                                  { return m.host }
func (m *access) DeviceID() int                                         { return m.id }

// collectUntil runs the garbage collector until cond holds, or fails.
func collectUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 100 {
		runtime.GC()
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("after 100 garbage collections: %s", what)
}
