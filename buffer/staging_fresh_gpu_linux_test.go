package buffer_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/internal/staging"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
)

// A copy out of a device below the way's threshold is staged when its
// destination's pages are fresh and it reaches FreshMinBytes, and only
// then; the bytes arrive every way.
func TestCopyToHostFreshThreshold(t *testing.T) {
	d, s, k := gpu(t)
	def := staging.Current()
	t.Cleanup(func() { require.NoError(t, staging.Set(def)) })
	const n = 1 << 20
	b := alloc(t, newResource(t, "device", d), n, s)
	require.NoError(t, k.Write(s, b.Ptr(), n, 5))
	for _, c := range []struct {
		name   string
		fresh  int  // FreshMinBytes
		mapped bool // the destination written before the copy
		staged bool
	}{
		{"fresh, at the threshold", n, false, true},
		{"fresh, below it", n + 1, false, false},
		{"mapped", n, true, false},
	} {
		p := def
		p.OutMinBytes, p.FreshMinBytes = 1<<30, c.fresh
		require.NoError(t, staging.Set(p))
		dst, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
		require.NoError(t, err)
		t.Cleanup(func() { _ = unix.Munmap(dst) })
		if c.mapped {
			for i := range dst {
				dst[i] = 1
			}
		}
		before := buffer.StagedCopies()
		require.NoError(t, buffer.CopyToHost(dst, b, s), c.name)
		requireBytes(t, cudatest.Pattern(n, 5), dst)
		want := int64(0)
		if c.staged {
			want = 1
		}
		assert.Equal(t, want, buffer.StagedCopies()-before, c.name)
	}
}
