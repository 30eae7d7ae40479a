package virtual

import (
	"errors"
	"sync"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// lockedFake serializes calls into a fakeDriver, as the real driver is
// safe to call from many threads.
type lockedFake struct {
	mu sync.Mutex
	f  *fakeDriver
}

func (l *lockedFake) Features() (cuda.Features, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Features()
}

func (l *lockedFake) AllocationGranularity(p *cuda.MemAllocationProp, k cuda.MemAllocationGranularity) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.AllocationGranularity(p, k)
}

func (l *lockedFake) MemCreate(size uint64, p *cuda.MemAllocationProp) (cuda.MemHandle, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.MemCreate(size, p)
}

func (l *lockedFake) MemRelease(h cuda.MemHandle) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.MemRelease(h)
}

func (l *lockedFake) MemAddressReserve(size, align uint64, hint cuda.DevicePtr) (cuda.DevicePtr, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.MemAddressReserve(size, align, hint)
}

func (l *lockedFake) MemAddressFree(p cuda.DevicePtr, size uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.MemAddressFree(p, size)
}

func (l *lockedFake) MemMap(p cuda.DevicePtr, size, off uint64, h cuda.MemHandle) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.MemMap(p, size, off, h)
}

func (l *lockedFake) MemUnmap(p cuda.DevicePtr, size uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.MemUnmap(p, size)
}

func (l *lockedFake) MemSetAccess(p cuda.DevicePtr, size uint64, d ...cuda.MemAccessDesc) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.MemSetAccess(p, size, d...)
}

func (l *lockedFake) MemGetAccess(p cuda.DevicePtr, loc cuda.MemLocation) (cuda.MemAccessFlags, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.MemGetAccess(p, loc)
}

func (l *lockedFake) MemExportFD(h cuda.MemHandle) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.MemExportFD(h)
}

func (l *lockedFake) MemImportFD(fd int) (cuda.MemHandle, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.MemImportFD(fd)
}

func (l *lockedFake) syncStream(s *cuda.Stream) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.syncStream(s)
}

func (l *lockedFake) peerCanAccess(p *cuda.Device) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.peerCanAccess(p)
}

// TestConcurrentOperations runs allocations, grows (some forced to move),
// shrinks, access changes and closes from many goroutines, closing
// buffers on other goroutines than made them; under -race this checks the
// locking, and at the end nothing may be left in the driver.
func TestConcurrentOperations(t *testing.T) {
	const g = 1 << 16
	f := newFake(g)
	lf := &lockedFake{f: f}
	r, err := newResource(lf, fakeDevice, &Options{HandleType: HandleNone, Peers: []*cuda.Device{fakePeer1}})
	mustOK(t, err)
	handoff := make(chan *buffer.Buffer, 64)
	var wg sync.WaitGroup
	errs := make(chan error, 1024)
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				b, err := r.Allocate(uint64(i%5+1)*g/2, nil)
				if err != nil {
					errs <- err
					return
				}
				if b, err = r.Grow(b, b.Size()+uint64(w+1)*g); err != nil {
					errs <- err
					return
				}
				if i%3 == 0 {
					if b, err = r.Shrink(b, g/2); err != nil {
						errs <- err
						return
					}
				}
				if err := r.SetPeerAccess(b, Access(i%3), fakePeer2); err != nil {
					errs <- err
					return
				}
				handoff <- b
				if err := (<-handoff).Close(); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if live := r.Live(); len(live) != 0 {
		t.Fatalf("allocations left: %#x", live)
	}
	mustOK(t, r.Reclaim())
	f.requireEmpty(t)
}

func (l *lockedFake) syncDevice() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.syncDevice()
}

func (l *lockedFake) hostAlloc(size uint64) ([]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.hostAlloc(size)
}

func (l *lockedFake) hostFree(mem []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.hostFree(mem)
}

func (l *lockedFake) copyDtoH(dst []byte, src cuda.DevicePtr) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.copyDtoH(dst, src)
}

func (l *lockedFake) copyHtoD(dst cuda.DevicePtr, src []byte) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.copyHtoD(dst, src)
}

func (l *lockedFake) newStream() (*cuda.Stream, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.newStream()
}

func (l *lockedFake) closeStream(s *cuda.Stream) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.closeStream(s)
}

func (l *lockedFake) copyHtoDAsync(dst cuda.DevicePtr, src []byte, s *cuda.Stream) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.copyHtoDAsync(dst, src, s)
}

// TestSleepRacesClose closes buffers from other goroutines while one
// sleeps and wakes their tag over and over: each Close lands awake,
// asleep or in the middle (then the Sleep or Wake that owns the
// allocation frees it as it ends), and in the end nothing is left.
func TestSleepRacesClose(t *testing.T) {
	lf := &lockedFake{f: newFake(testGran)}
	lf.f.next = fakeBase + sleepBase.Add(1)<<40
	r, err := newResource(lf, fakeDevice, &Options{HandleType: HandleNone, Tag: "t"})
	if err != nil {
		t.Fatal(err)
	}
	var bufs []*buffer.Buffer
	for range 8 {
		b, err := r.Allocate(testGran, nil)
		if err != nil {
			t.Fatal(err)
		}
		bufs = append(bufs, b)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 30 {
			if err := r.Sleep(&SleepOptions{Backup: BackupToHost}, "t"); err != nil {
				t.Error(err)
				return
			}
			if err := r.Wake(&WakeOptions{KeepHostBackup: true}, "t"); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for _, b := range bufs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.Use("test", func(cuda.DevicePtr) error { return nil }); err != nil && !errors.Is(err, ErrAsleep) {
				t.Errorf("Use: %v", err)
			}
			if err := b.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}()
	}
	wg.Wait()
	<-done
	if err := r.DropHostBackup(); err != nil {
		t.Fatal(err)
	}
	lf.mu.Lock()
	defer lf.mu.Unlock()
	if live := r.Live(); len(live) != 0 {
		t.Fatalf("allocations left: %#x", live)
	}
	lf.f.requireEmpty(t)
}
