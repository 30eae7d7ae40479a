package loader

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var errNoFile = errors.New("cannot open shared object file: No such file or directory")

// The message says "no CUDA driver" once, on one line, with paths that
// failed alike grouped, and suggests CUDAMEM_DRIVER only when it was unset.
func TestLoadErrorText(t *testing.T) {
	le := &LoadError{Attempts: []Attempt{
		{"libcuda.so.1", fmt.Errorf("dlopen: libcuda.so.1: %w", errNoFile)},
		{"libcuda.so", fmt.Errorf("dlopen: libcuda.so: %w", errNoFile)},
		{"/usr/lib/wsl/lib/libcuda.so.1", errors.New("dlopen: /usr/lib/wsl/lib/libcuda.so.1: invalid ELF header")},
	}}
	msg := le.Error()
	assert.Equal(t, "no CUDA driver: libcuda.so.1, libcuda.so: cannot open shared object file: No such file or directory; "+
		"/usr/lib/wsl/lib/libcuda.so.1: invalid ELF header (set CUDAMEM_DRIVER to the driver library's path to choose it)", msg)
	assert.Equal(t, 1, strings.Count(msg, "no CUDA driver"))
	assert.NotContains(t, msg, "\n")

	le = &LoadError{Attempts: []Attempt{{"/opt/x.so", fmt.Errorf("dlopen: /opt/x.so: %w", errNoFile)}}, FromEnv: true}
	msg = le.Error()
	assert.Equal(t, "no CUDA driver: /opt/x.so: cannot open shared object file: No such file or directory "+
		"(CUDAMEM_DRIVER chose the path; unset it to search the default paths)", msg)
	assert.NotContains(t, msg, "set CUDAMEM_DRIVER")

	le = &LoadError{Reason: "CUDA drivers do not exist for plan9/386"}
	assert.Equal(t, "no CUDA driver: CUDA drivers do not exist for plan9/386", le.Error())
	assert.Empty(t, le.Hint())
}

func TestAttemptReason(t *testing.T) {
	for _, tc := range []struct {
		a    Attempt
		want string
	}{
		{Attempt{"libcuda.so.1", errors.New("dlopen: libcuda.so.1: nope")}, "nope"},
		{Attempt{`C:\x\nvcuda.dll`, errors.New(`LoadLibrary: C:\x\nvcuda.dll: The specified module could not be found.`)}, "The specified module could not be found."},
		{Attempt{"libc.so.6", errors.New("not a CUDA driver: cuDriverGetVersion: symbol not found")}, "not a CUDA driver: cuDriverGetVersion: symbol not found"},
		{Attempt{"x", nil}, "<nil>"},
	} {
		assert.Equal(t, tc.want, tc.a.Reason(), tc.a.Path)
	}
}

// With CUDAMEM_DRIVER set, only its path is tried and the error says it
// came from there.
func TestSearchFromEnv(t *testing.T) {
	p := filepath.Join(t.TempDir(), "libcuda.so.1")
	_, err := search(p)
	var le *LoadError
	require.ErrorAs(t, err, &le)
	require.Len(t, le.Attempts, 1)
	assert.Equal(t, p, le.Attempts[0].Path)
	assert.True(t, le.FromEnv)
	assert.Contains(t, err.Error(), "CUDAMEM_DRIVER chose the path")
}
