//go:build linux

package probe

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
)

// wantErr checks err is a clear error: non-nil, an *OpError or wrapping
// one of the library's sentinels, naming op.
func wantErr(t *testing.T, what string, err error, op string) {
	t.Helper()
	if err == nil {
		t.Errorf("%s: no error", what)
		return
	}
	var oe *cuda.OpError
	if !errors.As(err, &oe) && !errors.Is(err, cuda.ErrInvalidArgument) && !errors.Is(err, cuda.ErrClosed) && !errors.Is(err, cuda.ErrNotSupported) {
		t.Errorf("%s: error %q is neither an *OpError nor wraps a sentinel", what, err)
	}
	if op != "" && !strings.Contains(err.Error(), op) {
		t.Errorf("%s: error %q does not name %q", what, err, op)
	}
}

// noPanic runs f, failing the test on a panic.
func noPanic(t *testing.T, what string, f func()) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("%s: panic: %v", what, r)
		}
	}()
	f()
}

func dev(t *testing.T, i int) *cuda.Device {
	t.Helper()
	d, err := cuda.GetDevice(i)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func closeAll(t *testing.T, bs ...*buffer.Buffer) {
	t.Helper()
	for _, b := range bs {
		if b != nil {
			if err := b.Close(); err != nil {
				t.Errorf("close %v: %v", b, err)
			}
		}
	}
}

// baseline checks that the fake's counters come back.
func baseline(t *testing.T) func() {
	t.Helper()
	before := fake.Snapshot()
	return func() {
		t.Helper()
		if d := diffNoCtx(fake.Snapshot(), before); d != "" {
			t.Errorf("fake driver counters changed: %s", d)
		}
	}
}

var _ = fmt.Sprintf

func diffNoCtx(now, before fakecuda.Snapshot) string {
	now[fakecuda.CtxRetains] = before[fakecuda.CtxRetains]
	return now.Diff(before)
}
