package ipc

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

// TestExportBufferRacesClose: ExportBuffer of a buffer that another
// goroutine closes answers a descriptor or an error matching
// cuda.ErrClosed, never another error. Before, the buffer's resource was
// read bare, and a Close in between made it nil: "comes from <nil>, not an
// exportable pool" (cuda.ErrInvalidArgument).
func TestExportBufferRacesClose(t *testing.T) {
	p, f := fakePool(t)
	exported := 0
	for i := range 300 {
		b, err := p.Import(desc(p, uint64(i+1), 4096, 4096), nil)
		require.NoError(t, err)
		var wg sync.WaitGroup
		var mu sync.Mutex
		errs := make(chan error, 5)
		start := make(chan struct{})
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				n := 0
				for {
					d, err := ExportBuffer(b)
					if err == nil {
						if d.Pool != p.UUID() || d.Size != 4096 {
							errs <- fmt.Errorf("descriptor %v of buffer %v", d, b)
							return
						}
						n++
						continue
					}
					if !errors.Is(err, cuda.ErrClosed) {
						errs <- fmt.Errorf("ExportBuffer racing Close (after %d descriptors): %w", n, err)
					}
					break
				}
				mu.Lock()
				exported += n
				mu.Unlock()
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			runtime.Gosched()
			if err := b.Close(); err != nil {
				errs <- err
			}
		}()
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("round %d: %v", i, err)
		}
	}
	t.Logf("%d descriptors made before the Closes", exported)
	require.NoError(t, p.Close())
	frees, bad, destroyed := f.counts()
	require.Equal(t, 300, frees)
	require.Zero(t, bad)
	require.Equal(t, 1, destroyed)
}
