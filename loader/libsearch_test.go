//go:build linux && (amd64 || arm64)

package loader

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLibBase(t *testing.T) {
	for _, c := range []struct{ in, base, want string }{
		{"cublas", "cublas", ""},
		{"libcublas", "cublas", ""},
		{"libcublas.so", "cublas", "libcublas.so"},
		{"libcublas.so.12", "cublas", "libcublas.so.12"},
		{"cublas64_12.dll", "cublas", "cublas64_12.dll"},
		{"cublasLt", "cublasLt", ""},
	} {
		base, want := libBase(c.in)
		assert.Equal(t, c.base, base, c.in)
		assert.Equal(t, c.want, want, c.in)
	}
}

func fakeEnv(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func fakeGlob(m map[string][]string) func(string) ([]string, error) {
	return func(p string) ([]string, error) { return m[p], nil }
}

func TestSearchStepsOrder(t *testing.T) {
	env := fakeEnv(map[string]string{EnvLibraryPath: "/opt/wheel/lib::/opt/wheel/lib", "CUDA_PATH": "/cuda"})
	glob := fakeGlob(map[string][]string{
		"/usr/local/cuda/targets/*/lib": {"/usr/local/cuda/targets/x86_64-linux/lib"},
		"/usr/local/cuda-*/lib64":       {"/usr/local/cuda-12.9/lib64", "/usr/local/cuda-12.10/lib64", "/usr/local/cuda-13.0/lib64"},
	})
	steps := searchSteps("cublas", "linux", env, glob)
	var got []string
	for _, s := range steps {
		if s.dir == "" {
			got = append(got, s.name)
		} else {
			got = append(got, s.pattern)
		}
	}
	want := []string{"/opt/wheel/lib/libcublas.so*"}
	for _, m := range majors {
		want = append(want, "libcublas.so."+strconv.Itoa(m))
	}
	want = append(want, "libcublas.so",
		"/cuda/lib64/libcublas.so*", "/cuda/lib/libcublas.so*",
		"/usr/local/cuda/lib64/libcublas.so*",
		"/usr/local/cuda/targets/x86_64-linux/lib/libcublas.so*",
		"/usr/local/cuda-13.0/lib64/libcublas.so*", "/usr/local/cuda-12.10/lib64/libcublas.so*", "/usr/local/cuda-12.9/lib64/libcublas.so*")
	assert.Equal(t, want, got)

	// An exact soname goes first; a path is tried alone.
	steps = searchSteps("libcublas.so.12", "linux", env, glob)
	assert.Equal(t, "/opt/wheel/lib/libcublas.so*", steps[0].pattern)
	assert.Equal(t, "libcublas.so.12", steps[1].name)
	assert.Equal(t, []step{{name: "/x/libcublas.so.12"}}, searchSteps("/x/libcublas.so.12", "linux", env, glob))

	// Windows: DLL names and CUDA_PATH\bin\x64 then bin.
	steps = searchSteps("cublas", "windows", fakeEnv(map[string]string{"CUDA_PATH": `C:\cuda`}), glob)
	assert.Equal(t, "cublas64_15.dll", steps[0].name)
	last := steps[len(steps)-2:]
	assert.Contains(t, last[0].pattern, "x64")
	assert.True(t, strings.HasSuffix(last[1].pattern, "cublas64_*.dll"))
}

func TestRankFiles(t *testing.T) {
	in := []string{"/d/libcublas.so", "/d/libcublas.so.12.8.4.1", "/d/libcublas.so.12", "/d/libcublas.so.13", "/d/libcublas.so.13.0.1"}
	assert.Equal(t, []string{"/d/libcublas.so.13", "/d/libcublas.so.13.0.1", "/d/libcublas.so.12", "/d/libcublas.so.12.8.4.1", "/d/libcublas.so"}, rankFiles(in, ""))
	assert.Equal(t, "/d/libcublas.so.12", rankFiles(in, "libcublas.so.12")[0], "the exact name asked for first")
}

func TestOpenCUDALibraryNotFound(t *testing.T) {
	t.Setenv(EnvLibraryPath, t.TempDir())
	_, err := OpenCUDALibrary("cudamemnosuchlib")
	require.Error(t, err)
	assert.ErrorIs(t, err, ErrLibraryNotFound)
	var le *LibraryError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, "cudamemnosuchlib", le.Name)
	assert.Greater(t, len(le.Attempts), len(majors))
	assert.Contains(t, err.Error(), "libcudamemnosuchlib.so.12")
	assert.Contains(t, err.Error(), "/usr/local/cuda/lib64/libcudamemnosuchlib.so*")
	assert.Contains(t, err.Error(), EnvLibraryPath)
	assert.Equal(t, len(le.Attempts), len(LibraryCandidates("cudamemnosuchlib")))

	_, err = OpenCUDALibrary("")
	assert.ErrorIs(t, err, ErrInvalidArgument)
	var nilErr *LibraryError
	assert.Equal(t, "<nil>", nilErr.Error())
}

// cc builds a shared library from C source.
func cc(t *testing.T, out, src string, args ...string) {
	t.Helper()
	c := os.Getenv("CC")
	if c == "" {
		c = "cc"
	}
	if _, err := exec.LookPath(c); err != nil {
		if os.Getenv("CUDAMEM_REQUIRE_CC") != "" {
			t.Fatalf("no C compiler (%s): %v", c, err)
		}
		t.Skipf("needs a C compiler (%s): %v", c, err)
	}
	srcPath := out + ".c"
	require.NoError(t, os.WriteFile(srcPath, []byte(src), 0o600))
	cmd := exec.Command(c, append([]string{"-shared", "-fPIC", "-o", out, srcPath}, args...)...)
	b, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", b)
}

// A library in a directory that needs another from the same directory,
// without an rpath: OpenCUDALibrary opens the dependency first.
func TestOpenCUDALibraryFromDirectoryWithDependency(t *testing.T) {
	dir := t.TempDir()
	dep := filepath.Join(dir, "libcudamemtestdep.so.1")
	cc(t, dep, "int cudamem_dep(int x) { return x + 1; }\n", "-Wl,-soname,libcudamemtestdep.so.1")
	lib := filepath.Join(dir, "libcudamemtest.so.3")
	cc(t, lib, "int cudamem_dep(int);\nint cudamem_main(int x) { return cudamem_dep(x) * 2; }\n",
		"-Wl,-soname,libcudamemtest.so.3", "-L"+dir, "-l:libcudamemtestdep.so.1")
	// An older major beside it must lose to the newer.
	cc(t, filepath.Join(dir, "libcudamemtest.so.2"), "int cudamem_main(int x) { return -1; }\n")

	_, err := OpenLibrary(lib)
	require.Error(t, err, "without help the dependency is not found (no rpath, not on LD_LIBRARY_PATH)")

	t.Setenv(EnvLibraryPath, dir)
	l, err := OpenCUDALibrary("cudamemtest")
	require.NoError(t, err)
	defer l.Close()
	assert.Equal(t, lib, l.Path())
	p, err := l.Lookup("cudamem_main")
	require.NoError(t, err)
	assert.Equal(t, uintptr(42), p.Call(20))
	assert.Equal(t, lib, LibraryCandidates("cudamemtest")[0])
}

// Bind gives a Proc from another library the driver's context setter.
func TestBindForeignProc(t *testing.T) {
	d, err := openFake(t, fakeDriver(t), 12040, 0)
	require.NoError(t, err)
	// As Library.Lookup returns it: an address and no context setter.
	foreign := Proc{addr: d.CtxGetCurrent.addr, name: "foreignGetCurrent"}
	assert.False(t, foreign.Bound())
	var got uintptr
	assert.Equal(t, NotFound, foreign.CallCtx(0x1234, uintptr(unsafe.Pointer(&got))))

	b := d.Bind(foreign)
	assert.True(t, b.Bound())
	assert.Equal(t, "foreignGetCurrent", b.Name())
	assert.Equal(t, uintptr(0), b.CallCtx(0x1234, uintptr(unsafe.Pointer(&got))))
	assert.Equal(t, uintptr(0x1234), got, "the context was current when the function ran")
	got = 0
	assert.Equal(t, uintptr(201), b.CallCtx(0xbad, uintptr(unsafe.Pointer(&got)))&0xffffffff)
	assert.Zero(t, got, "a failed cuCtxSetCurrent stops the call")

	var nd *Driver
	assert.False(t, func() *Proc { p := nd.Bind(foreign); return &p }().Bound(), "a nil Driver leaves it unbound")
	var np *Proc
	assert.False(t, np.Bound())
}
