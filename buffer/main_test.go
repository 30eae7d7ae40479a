package buffer_test

import (
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cudamem/cudamem/buffer"
)

// expectedLeaks counts the buffers the leak tests drop on purpose; every
// other buffer a test makes must be closed.
var expectedLeaks atomic.Int64

func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		// Let the cleanups of anything dropped run, then compare.
		for range 5 {
			runtime.GC()
			time.Sleep(10 * time.Millisecond)
		}
		if got, want := buffer.Leaks(), expectedLeaks.Load(); got != want {
			fmt.Fprintf(os.Stderr, "buffer: Leaks() = %d, want %d (the leak tests' own): a test dropped a buffer without Close\n", got, want)
			code = 1
		}
	}
	os.Exit(code)
}

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
