//go:build linux && (amd64 || arm64)

package loader

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func libc(t testing.TB) *Library {
	t.Helper()
	l, err := OpenLibrary("libc.so.6")
	require.NoError(t, err)
	return l
}

func lookup(t testing.TB, l *Library, name string) Proc {
	t.Helper()
	p, err := l.Lookup(name)
	require.NoError(t, err)
	require.True(t, p.Found())
	return p
}

func cstr(s string) []byte { return append([]byte(s), 0) }

func TestCallLibcArities(t *testing.T) {
	l := libc(t)
	getpid := lookup(t, l, "getpid")
	assert.Equal(t, os.Getpid(), int(int32(getpid.Call())), "0 args")

	strlen := lookup(t, l, "strlen")
	s := cstr("cudamem")
	assert.Equal(t, uintptr(7), strlen.Call(uintptr(unsafe.Pointer(&s[0]))), "1 arg")

	labs := lookup(t, l, "labs")
	neg := -12345
	assert.Equal(t, uintptr(12345), labs.Call(uintptr(neg)), "negative argument keeps its 64 bits")

	memcmp := lookup(t, l, "memcmp")
	a, b := cstr("abcdef"), cstr("abcxef")
	assert.Equal(t, uintptr(0), memcmp.Call(uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0])), 3), "3 args")
	assert.NotEqual(t, uintptr(0), memcmp.Call(uintptr(unsafe.Pointer(&a[0])), uintptr(unsafe.Pointer(&b[0])), 4))

	// snprintf with 16 integer arguments: buf, size, format and 13 values,
	// so the last seven travel on the stack (amd64) or eight (arm64).
	snprintf := lookup(t, l, "snprintf")
	buf := make([]byte, 128)
	format := cstr("%ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld %ld")
	n := snprintf.Call(uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(unsafe.Pointer(&format[0])),
		1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13)
	want := "1 2 3 4 5 6 7 8 9 10 11 12 13"
	assert.Equal(t, uintptr(len(want)), n)
	assert.Equal(t, want, string(buf[:len(want)]))
	runtime.KeepAlive(buf)
}

func TestCallRejectsBadInput(t *testing.T) {
	var p Proc
	assert.Equal(t, NotFound, p.Call(1, 2), "unresolved proc")
	assert.Equal(t, NotFound, p.CallCtx(1, 2), "unresolved proc with context")
	strlen := lookup(t, libc(t), "strlen")
	args := make([]uintptr, MaxArgs+1)
	assert.Equal(t, NotFound, strlen.Call(args...), "too many arguments")
}

func TestCallWritesThroughStackPointer(t *testing.T) {
	// The callee writes into a Go stack variable; the write must be seen.
	l := libc(t)
	memset := lookup(t, l, "memset")
	var x uint64
	memset.Call(uintptr(unsafe.Pointer(&x)), 0xab, 8)
	assert.Equal(t, uint64(0xabababababababab), x)
}

func TestCallAllocatesNothing(t *testing.T) {
	strlen := lookup(t, libc(t), "strlen")
	s := cstr("zero allocations")
	p := uintptr(unsafe.Pointer(&s[0]))
	allocs := testing.AllocsPerRun(1000, func() { strlen.Call(p) })
	assert.Zero(t, allocs)
	var n uint64
	memset := lookup(t, libc(t), "memset")
	allocs = testing.AllocsPerRun(1000, func() { memset.Call(uintptr(unsafe.Pointer(&n)), 0, 8) })
	assert.Zero(t, allocs, "a pointer to a stack variable must not move it to the heap")
}

func TestCallConcurrent(t *testing.T) {
	l := libc(t)
	strlen := lookup(t, l, "strlen")
	var wg sync.WaitGroup
	for g := 0; g < 64; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			s := cstr(strings.Repeat("x", g))
			for i := 0; i < 2000; i++ {
				if r := strlen.Call(uintptr(unsafe.Pointer(&s[0]))); r != uintptr(g) {
					t.Errorf("strlen = %d, want %d", r, g)
					return
				}
			}
		}(g)
	}
	wg.Wait()
}

func TestSearchPathsEnvOverride(t *testing.T) {
	t.Setenv(EnvDriver, "/opt/custom/libcuda.so.1")
	assert.Equal(t, []string{"/opt/custom/libcuda.so.1"}, SearchPaths())
	t.Setenv(EnvDriver, "")
	assert.Equal(t, []string{"libcuda.so.1", "libcuda.so", "/usr/lib/wsl/lib/libcuda.so.1"}, SearchPaths())
}

func TestOpenMissingFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "libcuda.so.1")
	_, err := Open(p)
	var le *LoadError
	require.ErrorAs(t, err, &le)
	require.Len(t, le.Attempts, 1)
	msg := err.Error()
	assert.Contains(t, msg, p)
	assert.Contains(t, msg, "No such file")
	assert.Contains(t, msg, EnvDriver, "the error says how to override")
}

func TestOpenNotALibrary(t *testing.T) {
	p := filepath.Join(t.TempDir(), "libcuda.so.1")
	require.NoError(t, os.WriteFile(p, []byte("this is not an ELF file, just text\n"), 0o644))
	_, err := Open(p)
	require.Error(t, err)
	assert.Contains(t, err.Error(), p)
	assert.Regexp(t, "invalid ELF header|file too short", err.Error())
}

func TestOpenLibraryThatIsNotCUDA(t *testing.T) {
	_, err := Open("libc.so.6")
	require.Error(t, err)
	assert.Contains(t, err.Error(), "libc.so.6")
	assert.Contains(t, err.Error(), "not a CUDA driver")
	assert.Contains(t, err.Error(), "cuDriverGetVersion")
}

func TestOpenListsEveryAttempt(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.so"), filepath.Join(dir, "b.so")
	_, err := Open(a, b)
	var le *LoadError
	require.ErrorAs(t, err, &le)
	require.Len(t, le.Attempts, 2)
	assert.Equal(t, a, le.Attempts[0].Path)
	assert.Equal(t, b, le.Attempts[1].Path)
	_, err = Open()
	require.ErrorAs(t, err, &le)
}

// fakeDriver compiles testdata/fakecuda.c into a shared library.
func fakeDriver(t *testing.T) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		if os.Getenv("CUDAMEM_REQUIRE_CC") != "" {
			t.Fatalf("no C compiler (%s): %v", cc, err)
		}
		t.Skipf("fake driver needs a C compiler (%s): %v", cc, err)
	}
	out := filepath.Join(t.TempDir(), "libfakecuda.so")
	cmd := exec.Command(cc, "-shared", "-fPIC", "-O1", "-fno-omit-frame-pointer", "-o", out, "testdata/fakecuda.c")
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
	return out
}

// fakeTable is an entry-point table as a caller of Resolve writes one: a
// few entry points the fake provides, one it lacks, one per tag, the
// Driver embedded (as package cuda does) and fields Resolve must leave
// alone.
type fakeTable struct {
	*Driver
	DriverGetVersion Proc `lookup:"dlsym"`
	CtxSetCurrent, CtxGetCurrent, DeviceGetCount, DeviceGetName,
	LaunchKernel Proc
	MemGetInfo Proc `dlsym:"cuMemGetInfo_v2"`
	MemAdvise  Proc `since:"12020" dlsym:"cuMemAdvise_v2"`
	// cuDeviceGet again, as another ABI would be named.
	DeviceGetV2 Proc
	// Requested at a version newer than any driver.
	DeviceGetAttribute Proc `since:"99000"`

	deviceGet Proc // unexported: not an entry point
	Count     int  // not a Proc
}

// openFake opens the fake at path as a driver of the given version whose
// cuInit returns initResult, and resolves a fakeTable from it.
func openFake(t *testing.T, path string, version, initResult int) (*fakeTable, error) {
	t.Helper()
	l, err := OpenLibrary(path)
	require.NoError(t, err)
	setV := lookup(t, l, "fake_set_version")
	setI := lookup(t, l, "fake_set_init_result")
	setV.Call(uintptr(version))
	setI.Call(uintptr(initResult))
	d, err := Open(path)
	if d == nil {
		return nil, err
	}
	tab := &fakeTable{Driver: d, Count: 7}
	_, rerr := d.Resolve(tab)
	require.NoError(t, rerr)
	return tab, err
}

func TestFakeDriverResolution(t *testing.T) {
	path := fakeDriver(t)
	d, err := openFake(t, path, 12040, 0)
	require.NoError(t, err)
	assert.Equal(t, 12040, d.Version)
	assert.Equal(t, path, d.Path)
	assert.Equal(t, "cuGetProcAddress_v2", d.getProcAddress.Name())

	var n int32
	require.True(t, d.DeviceGetCount.Found())
	assert.Equal(t, "cuDeviceGetCount", d.DeviceGetCount.Name())
	assert.Equal(t, uintptr(0), d.DeviceGetCount.Call(uintptr(unsafe.Pointer(&n))))
	assert.Equal(t, int32(3), n)

	// Entry points the fake lacks are unresolved, report NotFound, and are
	// listed, by base name, in field order.
	assert.False(t, d.MemGetInfo.Found())
	assert.Equal(t, "cuMemGetInfo", d.MemGetInfo.Name())
	assert.Equal(t, NotFound, d.MemGetInfo.Call(0, 0))
	missing, err := d.Resolve(&fakeTable{})
	require.NoError(t, err)
	assert.Equal(t, []string{"cuMemGetInfo", "cuDeviceGetAttribute"}, missing)

	// A V<n> suffix names the same base entry point at another ABI.
	assert.Equal(t, "cuDeviceGet", d.DeviceGetV2.Name())
	assert.True(t, d.DeviceGetV2.Found())
	// Fields that are not exported Procs are left as they were.
	assert.False(t, d.deviceGet.Found())
	assert.Equal(t, 7, d.Count)

	// lookup:"dlsym" finds what the fake's cuGetProcAddress does not serve,
	// and the bootstrap entry points take the context path too.
	var v int32
	require.True(t, d.DriverGetVersion.Found())
	assert.Equal(t, uintptr(0), d.DriverGetVersion.CallCtx(0x1234, uintptr(unsafe.Pointer(&v))))
	assert.Equal(t, int32(12040), v)
	for _, p := range []Proc{d.DeviceGetCount, d.MemGetInfo, d.DriverGetVersion} {
		assert.True(t, p.Bound(), "%s is bound to the driver", p.Name())
	}

	// cuMemAdvise is requested at the CUDA 12.2 ABI (CUmemLocation by value).
	assert.Equal(t, uintptr(1002), d.MemAdvise.Call(0, 0, 0, 0))
}

// Resolve refuses what is not a table, and a malformed tag, before
// writing anything.
func TestResolveRefusesBadTables(t *testing.T) {
	d, err := openFake(t, fakeDriver(t), 12040, 0)
	require.NoError(t, err)
	var nd *Driver
	_, err = nd.Resolve(&fakeTable{})
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "nil Driver")
	var nilTable *fakeTable
	var proc Proc
	for _, table := range []any{nil, fakeTable{}, nilTable, new(int)} {
		_, err := d.Resolve(table)
		assert.ErrorIs(t, err, ErrInvalidArgument, "%T", table)
		assert.ErrorContains(t, err, "not a non-nil pointer to a struct")
	}
	// A pointer to some other struct (a Proc itself, say) is no table.
	for _, table := range []any{&proc, &struct{ N int }{}} {
		_, err := d.Resolve(table)
		assert.ErrorIs(t, err, ErrInvalidArgument, "%T", table)
		assert.ErrorContains(t, err, "has no exported Proc fields")
	}
	badSince := &struct {
		DeviceGetCount Proc
		MemAdvise      Proc `since:"12.2"`
	}{}
	_, err = d.Resolve(badSince)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, `MemAdvise: since tag "12.2"`)
	assert.False(t, badSince.DeviceGetCount.Found(), "nothing is written")
	badLookup := &struct {
		DeviceGetCount Proc `lookup:"dlopen"`
	}{}
	_, err = d.Resolve(badLookup)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, `lookup tag "dlopen"`)
}

func TestFakeDriverOldVersion(t *testing.T) {
	// A 12.0 driver would hand out the old cuMemAdvise ABI: leave it unresolved.
	d, err := openFake(t, fakeDriver(t), 12000, 0)
	require.NoError(t, err)
	assert.False(t, d.MemAdvise.Found(), "old-ABI cuMemAdvise must not be used")
	assert.True(t, d.DeviceGetCount.Found())
	// An 11.8 driver: requests are capped at the driver's version.
	d, err = openFake(t, fakeDriver(t), 11080, 0)
	require.NoError(t, err)
	assert.True(t, d.DeviceGetCount.Found(), "resolved at the driver's own version")
}

func TestFakeDriverInitFailure(t *testing.T) {
	d, err := openFake(t, fakeDriver(t), 12040, 100)
	var ie *InitError
	require.ErrorAs(t, err, &ie)
	assert.Equal(t, int32(100), ie.Code)
	require.NotNil(t, d, "the driver is returned for diagnostics")
	assert.Equal(t, 12040, d.Version)
}

func TestCallCtxSetsContextOnSameThread(t *testing.T) {
	d, err := openFake(t, fakeDriver(t), 12040, 0)
	require.NoError(t, err)
	get := d.CtxGetCurrent
	require.True(t, get.Found())
	// Call through the context-setting path with ctxfn = the fake's
	// cuCtxSetCurrent, whatever the package-level one is.
	var got uintptr
	r := call(get.addr, d.ctxSetCurrent.addr, 0x1234, []uintptr{uintptr(unsafe.Pointer(&got))})
	assert.Equal(t, uintptr(0), r)
	assert.Equal(t, uintptr(0x1234), got)
	// A failing cuCtxSetCurrent stops the call and returns its result.
	got = 0
	r = call(get.addr, d.ctxSetCurrent.addr, 0xbad, []uintptr{uintptr(unsafe.Pointer(&got))})
	assert.Equal(t, uintptr(201), r&0xffffffff)
	assert.Equal(t, uintptr(0), got, "the entry point was not called")
}

func TestSixteenArguments(t *testing.T) {
	d, err := openFake(t, fakeDriver(t), 12040, 0)
	require.NoError(t, err)
	var want uintptr
	args := make([]uintptr, 16)
	for i := range args {
		args[i] = uintptr(1000 + i*i)
		want += uintptr(i+1) * args[i]
	}
	assert.Equal(t, want, d.LaunchKernel.Call(args...))
	assert.Equal(t, want, d.LaunchKernel.CallCtx(0, args...), "same through the context path (ctx 0 is allowed)")
}

// Benchmarks of the call path itself, beside purego's SyscallN in the same
// run. GPU figures (driver calls, with a cgo baseline) are in package cuda
// and cudamem bench.
func BenchmarkCallLabs(b *testing.B) {
	labs := lookup(b, libc(b), "labs")
	b.ReportAllocs()
	for b.Loop() {
		labs.Call(7)
	}
}

func BenchmarkSyscallNLabs(b *testing.B) {
	labs := lookup(b, libc(b), "labs")
	b.ReportAllocs()
	for b.Loop() {
		purego.SyscallN(labs.addr, 7)
	}
}

func TestStackAlignedForC(t *testing.T) {
	// C code may use aligned SSE stores to its stack; a trampoline that
	// misaligns the stack crashes libc (seen: snprintf, cuInit).
	path := fakeDriver(t)
	d, err := openFake(t, path, 12040, 0)
	require.NoError(t, err)
	l, err := OpenLibrary(path)
	require.NoError(t, err)
	p := lookup(t, l, "fake_stack_misalignment")
	assert.Equal(t, uintptr(0), p.Call(), "direct")
	assert.Equal(t, uintptr(0), call(p.addr, d.ctxSetCurrent.addr, 0x1234, nil), "through the context path")
	assert.Equal(t, NotFound, p.CallCtx(0), "a plain library symbol has no context setter")
	assert.Equal(t, uintptr(0), call(p.addr, 0, 0, make([]uintptr, MaxArgs)), "with stack arguments")
}

var stackPad [64]byte

// deepWrite recurses n frames deep (to land the call at many different
// stack depths) and then has C write into a stack variable from inside a
// closure, the pattern of the cuda package's lazy initializers.
//
//go:noinline
func deepWrite(t *testing.T, p Proc, n, depth int) {
	var pad [128]byte
	stackPad[0] = pad[n%128]
	if n > 0 {
		deepWrite(t, p, n-1, depth)
		return
	}
	var once sync.Once
	var got uint64
	once.Do(func() {
		var c uint64
		p.Call(uintptr(unsafe.Pointer(&c)), 0xab, 8)
		got = c
	})
	if got != 0xabababababababab {
		t.Errorf("depth %d: the C write into a stack variable was lost (%#x): the stack moved mid-call", depth, got)
	}
}

// TestCallSurvivesStackGrowth: a pointer argument computed by the caller
// must stay valid until C runs. Under -race, copy() inside the call path
// became runtime.slicecopy, whose prologue could move the stack; this test
// caught it (run it with go test -race).
func TestCallSurvivesStackGrowth(t *testing.T) {
	memset := lookup(t, libc(t), "memset")
	for depth := 0; depth < 400; depth++ {
		done := make(chan struct{})
		go func() { defer close(done); deepWrite(t, memset, depth, depth) }()
		<-done
	}
}

// TestProcAt calls a function through a Proc made from its bare address,
// as for a function pointer foreign code hands over.
func TestProcAt(t *testing.T) {
	strlen := lookup(t, libc(t), "strlen")
	p := ProcAt(strlen.Addr(), "strlen via its address")
	assert.Equal(t, "strlen via its address", p.Name())
	assert.False(t, p.Bound(), "a Proc from an address has no driver to set contexts with")
	s := []byte("dlpack\x00")
	assert.Equal(t, uintptr(6), p.Call(uintptr(unsafe.Pointer(&s[0]))))
	assert.Equal(t, NotFound, p.CallCtx(0, uintptr(unsafe.Pointer(&s[0]))), "unbound")
	zero := ProcAt(0, "nothing")
	assert.Equal(t, NotFound, zero.Call(), "a zero address is unresolved")
}

func TestBaseName(t *testing.T) {
	assert.Equal(t, "cuMemcpyBatchAsync", baseName("MemcpyBatchAsyncV1"))
	assert.Equal(t, "cuCtxCreate", baseName("CtxCreateV4"))
	assert.Equal(t, "cuMemsetD32Async", baseName("MemsetD32Async"))
	assert.Equal(t, "cuMemcpyHtoD", baseName("MemcpyHtoD"))
	assert.Equal(t, "cuV", baseName("V"))
}
