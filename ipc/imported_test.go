package ipc

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// fakeImport is a driver for an imported pool that behaves as the real one
// does where it matters here: exporting data names an allocation (its id
// and true size are in the first 16 bytes); importing an allocation that
// is already mapped returns the same pointer (nvbug 5570902), and one free
// unmaps it; freeing an unmapped pointer fails with
// CUDA_ERROR_INVALID_VALUE.
type fakeImport struct {
	mu        sync.Mutex
	next      cuda.DevicePtr
	byID      map[uint64]cuda.DevicePtr
	size      map[cuda.DevicePtr]uint64 // live mappings
	ids       map[cuda.DevicePtr]uint64
	imports   int
	ranges    int
	frees     int
	badFrees  int
	destroyed int
	failFree  error
	failRange error

	failDestroy error // destroy fails with it while set
	// capturedDestroys: this many destroys fail with cuda.ErrCapturing, as
	// when a capture begins after the gate's check and ends before the
	// refusal is looked at.
	capturedDestroys int
	gone             bool // destroyed successfully
	lateCalls        int  // driver calls on the pool after it was destroyed
	// entered, when set, receives once an importPointer call begins, which
	// then waits for release to be closed (a call held in progress).
	entered chan struct{}
	release chan struct{}
}

func newFake() *fakeImport {
	return &fakeImport{next: 0x7f00_0000_0000, byID: map[uint64]cuda.DevicePtr{}, size: map[cuda.DevicePtr]uint64{}, ids: map[cuda.DevicePtr]uint64{}}
}

func exportData(id, size uint64) cuda.MemPoolPtrExportData {
	var d cuda.MemPoolPtrExportData
	binary.LittleEndian.PutUint64(d.Reserved[0:], id)
	binary.LittleEndian.PutUint64(d.Reserved[8:], size)
	return d
}

func (f *fakeImport) importPointer(d *cuda.MemPoolPtrExportData) (cuda.DevicePtr, error) {
	f.mu.Lock()
	entered, release := f.entered, f.release
	f.entered = nil
	f.mu.Unlock()
	if entered != nil {
		entered <- struct{}{}
		<-release
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gone {
		f.lateCalls++
	}
	f.imports++
	id, size := binary.LittleEndian.Uint64(d.Reserved[0:]), binary.LittleEndian.Uint64(d.Reserved[8:])
	if size == 0 {
		return 0, &cuda.OpError{Op: "cuMemPoolImportPointer", Err: cuda.ErrorInvalidValue}
	}
	if p, ok := f.byID[id]; ok {
		return p, nil
	}
	p := f.next
	f.next += 1 << 30
	f.byID[id], f.size[p], f.ids[p] = p, size, id
	return p, nil
}

func (f *fakeImport) mapping(p cuda.DevicePtr) (cuda.DevicePtr, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gone {
		f.lateCalls++
	}
	f.ranges++
	if f.failRange != nil {
		return 0, 0, f.failRange
	}
	s, ok := f.size[p]
	if !ok {
		return 0, 0, &cuda.OpError{Op: "cuPointerGetAttribute", Err: cuda.ErrorInvalidValue}
	}
	return p, s, nil
}

func (f *fakeImport) free(p cuda.DevicePtr, _ *cuda.Stream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.gone {
		f.lateCalls++
	}
	if f.failFree != nil {
		return f.failFree
	}
	if _, ok := f.size[p]; !ok {
		f.badFrees++
		return &cuda.OpError{Op: "cuMemFreeAsync", Err: cuda.ErrorInvalidValue}
	}
	f.frees++
	delete(f.byID, f.ids[p])
	delete(f.size, p)
	delete(f.ids, p)
	return nil
}

func (f *fakeImport) destroy() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.destroyed++
	if f.gone {
		f.lateCalls++
	}
	if len(f.size) != 0 {
		return fmt.Errorf("pool destroyed with %d mappings live", len(f.size))
	}
	if f.capturedDestroys > 0 {
		f.capturedDestroys--
		return &cuda.OpError{Op: "cuMemPoolDestroy", Err: cuda.ErrCapturing}
	}
	if f.failDestroy != nil {
		return f.failDestroy
	}
	f.gone = true
	return nil
}

func (f *fakeImport) defaultStream() *cuda.Stream { return nil }

func (f *fakeImport) mapped(p cuda.DevicePtr) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.size[p]
	return ok
}

// driverCalls counts every call that reached the fake driver.
func (f *fakeImport) driverCalls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.imports + f.ranges + f.frees + f.badFrees + f.destroyed
}

func (f *fakeImport) counts() (frees, bad, destroyed int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.frees, f.badFrees, f.destroyed
}

// rawData is exportData's 64 bytes, as a foreign exporter sends them.
func rawData(id, size uint64) []byte {
	d := exportData(id, size)
	return d.Reserved[:]
}

func fakePool(t *testing.T) (*ImportedPool, *fakeImport) {
	t.Helper()
	f := newFake()
	return newImportedPool(nil, cuda.MemPool{}, f, cuda.NewUUID(), newPoolKey(), nil), f
}

// desc is a descriptor sealed with p's key, as the exporter would make it
// (the exporter holds the key, so a lying size still reaches the bounds
// checks).
func desc(p *ImportedPool, id, real, claimed uint64) Descriptor {
	return p.key.seal(Descriptor{Pool: p.UUID(), Size: claimed, Data: exportData(id, real)})
}

func TestWithin(t *testing.T) {
	const base = cuda.DevicePtr(0x7f00_0000_0000)
	for _, tc := range []struct {
		ptr       cuda.DevicePtr
		size, rng uint64
		ok        bool
	}{
		{base, 1 << 20, 1 << 20, true},
		{base, 1<<20 + 1, 1 << 20, false},
		{base + 4096, 1<<20 - 4096, 1 << 20, true},
		{base + 4096, 1 << 20, 1 << 20, false},
		{base, math.MaxUint64, 1 << 20, false},                    // ptr+size wraps below the range's end
		{base, math.MaxUint64 - uint64(base) + 1, 1 << 20, false}, // ptr+size wraps to exactly 0
		{base - 1, 1, 1 << 20, false},                             // before the mapping
		{base + 1<<21, 1, 1 << 20, false},                         // after it
		{base, 1, math.MaxUint64, false},                          // a range that wraps is no mapping
		{base, 0, 1 << 20, true},
	} {
		_, ok := within(tc.ptr, tc.size, base, tc.rng)
		assert.Equal(t, tc.ok, ok, "ptr %#x size %d range %d", uint64(tc.ptr), tc.size, tc.rng)
	}
}

// TestImportRefusesSizeOverflow: a descriptor with a size near 2^64 passed
// the old bounds check because ptr+size wrapped; it must be refused, and
// the mapping the import made released.
func TestImportRefusesSizeOverflow(t *testing.T) {
	p, f := fakePool(t)
	for _, claimed := range []uint64{math.MaxUint64, math.MaxUint64 - (1 << 20), 1<<20 + 1} {
		b, err := p.Import(desc(p, 1, 1<<20, claimed), nil)
		require.ErrorIs(t, err, cuda.ErrInvalidArgument, "size %d", claimed)
		assert.Nil(t, b)
		assert.Contains(t, err.Error(), fmt.Sprint(claimed))
	}
	frees, bad, _ := f.counts()
	assert.Equal(t, 3, frees, "each refused import released its own mapping")
	assert.Zero(t, bad)
	assert.Zero(t, p.Live())
	b, err := p.Import(desc(p, 1, 1<<20, 1<<20), nil)
	require.NoError(t, err)
	assert.Equal(t, uint64(1<<20), b.Size())
	require.NoError(t, b.Close())
	_, err = p.Import(desc(p, 1, 1<<20, 0), nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "size 0")
}

// TestRejectedImportKeepsEarlierImport: when the driver maps an allocation
// this process already imported, refusing the new descriptor must not free
// the mapping the earlier Buffer holds.
func TestRejectedImportKeepsEarlierImport(t *testing.T) {
	p, f := fakePool(t)
	good, err := p.Import(desc(p, 7, 1<<20, 1<<20), nil)
	require.NoError(t, err)
	_, err = p.Import(desc(p, 7, 1<<20, 4<<20), nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.True(t, f.mapped(good.Ptr()), "the valid import's mapping survives")
	frees, _, _ := f.counts()
	assert.Zero(t, frees)
	require.NoError(t, good.Close(), "and its Close still works")
	frees, bad, _ := f.counts()
	assert.Equal(t, 1, frees)
	assert.Zero(t, bad)
}

// TestDuplicateImport: the same descriptor imported twice gives two working
// Buffers on one mapping; closing both frees once, on the last, and the
// closed pool is destroyed after the last Buffer.
func TestDuplicateImport(t *testing.T) {
	for _, closePoolFirst := range []bool{false, true} {
		t.Run(fmt.Sprint("closePoolFirst=", closePoolFirst), func(t *testing.T) {
			p, f := fakePool(t)
			d := desc(p, 3, 1<<20, 1<<20)
			b1, err := p.Import(d, nil)
			require.NoError(t, err)
			b2, err := p.Import(d, nil)
			require.NoError(t, err)
			assert.Equal(t, b1.Ptr(), b2.Ptr(), "the driver returns one mapping")
			assert.Equal(t, int64(2), p.Live())
			for _, b := range []*buffer.Buffer{b1, b2} {
				re, err := ExportBuffer(b)
				require.NoError(t, err)
				assert.Equal(t, d, re, "each re-exports as imported")
			}
			if closePoolFirst {
				require.NoError(t, p.Close())
			}
			require.NoError(t, b1.Close())
			assert.True(t, f.mapped(b2.Ptr()), "b2 still works after b1's Close")
			frees, _, destroyed := f.counts()
			assert.Zero(t, frees)
			assert.Zero(t, destroyed)
			require.NoError(t, b2.Close(), "the second Close succeeds")
			frees, bad, _ := f.counts()
			assert.Equal(t, 1, frees, "freed once")
			assert.Zero(t, bad)
			assert.Zero(t, p.Live())
			if !closePoolFirst {
				_, _, destroyed = f.counts()
				assert.Zero(t, destroyed, "an open pool is not destroyed")
				require.NoError(t, p.Close())
			}
			_, _, destroyed = f.counts()
			assert.Equal(t, 1, destroyed, "destroyed after the last Buffer")
			require.NoError(t, p.Close())
			_, _, destroyed = f.counts()
			assert.Equal(t, 1, destroyed, "once")
		})
	}
}

// TestDuplicateImportConcurrent imports and closes the same descriptors
// from many goroutines: every Buffer's mapping stays mapped until its own
// Close, nothing is freed twice, and the pool ends destroyed with nothing
// mapped.
func TestDuplicateImportConcurrent(t *testing.T) {
	p, f := fakePool(t)
	descs := []Descriptor{desc(p, 1, 1<<20, 1<<20), desc(p, 2, 2<<20, 2<<20), desc(p, 2, 2<<20, 1<<20), desc(p, 3, 4096, 4096)}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				d := descs[(g+i)%len(descs)]
				b, err := p.Import(d, nil)
				if !assert.NoError(t, err) {
					return
				}
				if !assert.True(t, f.mapped(b.Ptr()), "mapped while its Buffer is open") {
					return
				}
				if i%3 == 0 { // an oversized duplicate now and then: refused, harmless
					bad := d
					bad.Size = math.MaxUint64
					bad = p.key.seal(bad) // past the MAC, to the bounds check
					_, err := p.Import(bad, nil)
					assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
					assert.True(t, f.mapped(b.Ptr()), "a refused duplicate frees nothing in use")
				}
				assert.NoError(t, b.Close())
			}
		}()
	}
	wg.Wait()
	_, bad, _ := f.counts()
	assert.Zero(t, bad, "no pointer freed twice")
	assert.Zero(t, p.Live())
	require.NoError(t, p.Close())
	_, _, destroyed := f.counts()
	assert.Equal(t, 1, destroyed)
	assert.Empty(t, f.size, "nothing left mapped")
}

// TestImportFailurePaths: a failed free keeps the Buffer open (retry works);
// a failed range query releases the mapping and joins nothing spurious; a
// pointer the pool never handed out is refused without a driver call.
func TestImportFailurePaths(t *testing.T) {
	p, f := fakePool(t)
	b, err := p.Import(desc(p, 1, 4096, 4096), nil)
	require.NoError(t, err)
	f.failFree = errors.New("injected free failure")
	require.Error(t, b.Close())
	assert.False(t, b.IsClosed(), "still open after a failed free")
	assert.Equal(t, int64(1), p.Live())
	f.failFree = nil
	require.NoError(t, b.Close())
	assert.Zero(t, p.Live())

	f.failRange = errors.New("injected range failure")
	_, err = p.Import(desc(p, 2, 4096, 4096), nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "injected range failure")
	f.failRange = nil
	assert.Empty(t, f.size, "the refused mapping was released")

	// Refused and the rollback failing: both errors reported.
	f.failFree = errors.New("injected free failure")
	_, err = p.Import(desc(p, 3, 4096, 8192), nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "injected free failure")
	f.failFree = nil
	require.NoError(t, f.free(f.byID[3], nil)) // what the failed rollback left

	frees, _, _ := f.counts()
	err = p.Deallocate(0xdead0000, 16, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	frees2, bad, _ := f.counts()
	assert.Equal(t, frees, frees2)
	assert.Zero(t, bad, "no driver call for a foreign pointer")

	_, err = p.Import(Descriptor{Pool: cuda.NewUUID(), Size: 1, Data: exportData(9, 1)}, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument, "descriptor of another pool")
	_, err = p.Allocate(1, nil)
	assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
	require.NoError(t, p.Close())
	_, err = p.Import(desc(p, 1, 4096, 4096), nil)
	assert.ErrorIs(t, err, cuda.ErrClosed)
	_, err = ExportPool(p)
	assert.ErrorIs(t, err, cuda.ErrClosed)
}

// A zero stream is refused before the driver maps anything: a refused
// mapping is unmapped on the stream given, and a zero one cannot, which
// left the mapping behind. (Closed streams and streams of another device
// are covered against the fake driver in internal/suites/probe.)
func TestImportRefusesZeroStream(t *testing.T) {
	p, f := fakePool(t)
	keyless := newImportedPool(nil, cuda.MemPool{}, f, cuda.NewUUID(), poolKey{}, nil)
	for _, imp := range []func() (*buffer.Buffer, error){
		func() (*buffer.Buffer, error) { return p.Import(desc(p, 1, 4096, 1<<20), new(cuda.Stream)) },
		func() (*buffer.Buffer, error) {
			return keyless.ImportUnauthenticated(rawData(1, 4096), 1<<20, new(cuda.Stream))
		},
	} {
		b, err := imp()
		require.Error(t, err)
		assert.Nil(t, b)
		assert.ErrorIs(t, err, cuda.ErrInvalidArgument)
		assert.Contains(t, err.Error(), "ImportedPool.Import")
		assert.Contains(t, err.Error(), "zero stream")
	}
	assert.Zero(t, f.driverCalls(), "the driver saw a refused import")
	assert.Zero(t, p.Live())
}

// A pool with a key takes no unauthenticated descriptor: every one its
// cudamem exporter makes is sealed, and one taken in unsealed would be
// sealed with the key on re-export, passing a forgery on as authenticated
// (found in review).
func TestKeyedPoolRefusesUnauthenticated(t *testing.T) {
	p, f := fakePool(t)
	_, err := p.ImportUnauthenticated(rawData(1, 4096), 4096, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "has a key")
	data := exportData(1, 4096)
	_, err = p.ImportUnauthenticated(data.Reserved[:], 4096, nil)
	require.ErrorIs(t, err, cuda.ErrInvalidArgument)
	assert.Zero(t, f.driverCalls(), "refused before the driver")
}
