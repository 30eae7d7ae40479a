//go:build linux

package probe

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/ipc"
	"github.com/cudamem/cudamem/resource"
)

// TestIPCImportRefusesCapturingStream: an imported mapping is not graph
// memory, and a refused import (a descriptor claiming more than the
// mapping the driver made) unmaps what it just mapped on the caller's
// stream. Import and ImportUnauthenticated did that free
// even when the stream captured (or was nil, the legacy stream, while a
// blocking stream captured): it became a graph node or failed, and the
// mapping was left behind. They now refuse such a stream with
// cuda.ErrCapturing before anything is imported: the capture stays valid,
// the driver's counters do not move, and the same imports work once the
// capture is over.
func TestIPCImportRefusesCapturingStream(t *testing.T) {
	d := dev(t, 0)
	check := baseline(t)
	defer check()
	pool, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{IPC: true, MaxSize: 64 << 20})
	require.NoError(t, err)
	defer pool.Close()
	b, err := pool.Allocate(64<<10, nil)
	require.NoError(t, err)
	defer b.Close()
	h, err := ipc.ExportPool(pool)
	require.NoError(t, err)
	defer h.Close()
	desc, err := ipc.ExportBuffer(b)
	require.NoError(t, err)
	// A keyless Handle of the same fd (as from an exporter that is not
	// cudamem) for the unauthenticated entry points.
	fd, err := h.FD()
	require.NoError(t, err)
	dup, err := syscall.Dup(fd)
	require.NoError(t, err)
	kh, err := ipc.NewHandle(dup, cuda.NewUUID().String())
	require.NoError(t, err)
	defer kh.Close()
	imp, err := ipc.ImportPool(d, kh)
	require.NoError(t, err)
	defer imp.Close()
	keyed, err := ipc.ImportPool(d, h)
	require.NoError(t, err)
	defer keyed.Close()

	nonBlocking, err := d.NewStreamWith(cuda.StreamNonBlocking, 0)
	require.NoError(t, err)
	defer nonBlocking.Close()
	blocking, err := d.NewStreamWith(cuda.StreamDefault, 0)
	require.NoError(t, err)
	defer blocking.Close()
	require.NoError(t, d.Sync())

	tooBig := ipc.Descriptor{Pool: imp.UUID(), Size: 1 << 40, Data: desc.Data}
	fits := ipc.Descriptor{Pool: imp.UUID(), Size: desc.Size, Data: desc.Data}
	imports := map[string]func(s *cuda.Stream) (*buffer.Buffer, error){
		"Import": func(s *cuda.Stream) (*buffer.Buffer, error) { return keyed.Import(desc, s) },
		"ImportUnauthenticated": func(s *cuda.Stream) (*buffer.Buffer, error) {
			return imp.ImportUnauthenticated(fits.ExportData(), fits.Size, s)
		},
		"ImportUnauthenticated/too big": func(s *cuda.Stream) (*buffer.Buffer, error) {
			return imp.ImportUnauthenticated(tooBig.ExportData(), tooBig.Size, s)
		},
		"ImportUnauthenticated/raw too big": func(s *cuda.Stream) (*buffer.Buffer, error) {
			return imp.ImportUnauthenticated(desc.ExportData(), 1<<40, s)
		},
	}
	for name, imp := range imports {
		for _, sit := range []struct {
			name     string
			captures *cuda.Stream // the stream that captures
			s        *cuda.Stream // the stream the import is given
		}{
			{"capturing stream", nonBlocking, nonBlocking},
			{"nil while a blocking stream captures", blocking, nil},
		} {
			t.Run(name+"/"+sit.name, func(t *testing.T) {
				before := fake.Snapshot()
				require.NoError(t, sit.captures.BeginCapture())
				nb, ierr := imp(sit.s)
				g, cerr := sit.captures.EndCapture()
				require.NoError(t, cerr, "the import invalidated the capture")
				require.NoError(t, g.Close())
				require.Nil(t, nb)
				require.ErrorIs(t, ierr, cuda.ErrCapturing)
				require.Contains(t, ierr.Error(), "ImportedPool.Import")
				require.Empty(t, diffNoCtx(fake.Snapshot(), before), "the refused import left driver state behind")
			})
		}
		// Outside a capture: a fitting descriptor imports, a refused one
		// leaves nothing behind either.
		before := fake.Snapshot()
		nb, err := imp(nonBlocking)
		if err == nil {
			require.NoError(t, nb.Close())
		} else {
			require.ErrorIs(t, err, ipc.ErrBadDescriptor, name)
		}
		require.NoError(t, nonBlocking.Sync())
		require.Empty(t, diffNoCtx(fake.Snapshot(), before), "%s outside a capture left driver state behind", name)
	}
}
