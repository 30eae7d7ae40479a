package buffer

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
)

// Host copies from and to ordinary (pageable) Go memory. The driver copies
// pageable memory by itself, staging it through its own pinned buffers with
// one CPU thread; that runs well below the bus's speed. Copies of at least
// stageMinBytes go through a small pool of pinned chunks instead: the CPU
// moves each piece between the Go slice and a chunk with several
// goroutines while the DMA engine moves the previous piece, and an event
// per chunk says when its DMA has finished so the chunk can be refilled.
//
// The pool is allocated on first use (cuMemHostAlloc, portable, so every
// device's context may use it) and kept for the life of the process. One
// copy uses it at a time; a copy that finds it busy goes to the driver's
// own path rather than wait.

const (
	// stageMinBytes is the smallest copy worth staging.
	stageMinBytes = 1 << 20
	// stageByDefault says whether staging is on unless a test overrides it.
	// It was chosen by BenchmarkCopyFromHost and BenchmarkCopyToHost.
	stageByDefault = true
)

// Staging parameters; tests and benchmarks change them through
// resetStaging (never while copies run).
var (
	stageChunkSize = 8 << 20 // bytes per pinned chunk
	stageChunks    = 4       // chunks in the pool
	stageWorkers   = 4       // goroutines per chunk's memory move (capped by GOMAXPROCS)
)

// stageMode overrides stageByDefault: 0 default, 1 on, 2 off.
var stageMode atomic.Int32

func stagingOn() bool {
	switch stageMode.Load() {
	case 1:
		return true
	case 2:
		return false
	}
	return stageByDefault
}

// stagePool is the process's pinned staging memory.
type stagePool struct {
	mu     sync.Mutex // held for a whole staged copy
	ready  bool
	err    error // allocation failed or the pool is unusable: copy directly
	chunks []*chunk
	next   int // the chunk used least recently
	size   int // bytes per chunk
}

type chunk struct {
	host    unsafe.Pointer // cuMemHostAlloc'd
	mem     []byte         // the same memory
	dev     *cuda.Device   // allocated through this device's context
	events  map[*cuda.Device]*cuda.Event
	pending *cuda.Event // recorded after the chunk's last DMA; nil when idle
}

var stage stagePool

// acquire locks the pool for one copy and allocates it on first use. It
// returns false (and holds no lock) when the pool is busy or unusable.
func (p *stagePool) acquire(dev *cuda.Device) bool {
	if !p.mu.TryLock() {
		return false
	}
	if !p.ready && p.err == nil {
		p.err = p.alloc(dev)
		p.ready = p.err == nil
	}
	if p.err != nil {
		p.mu.Unlock()
		return false
	}
	return true
}

func (p *stagePool) alloc(dev *cuda.Device) error {
	p.size, p.next = stageChunkSize, 0
	for range stageChunks {
		h, err := dev.MemHostAlloc(uint64(stageChunkSize), cuda.MemHostAllocPortable)
		if err != nil {
			p.free()
			return err
		}
		p.chunks = append(p.chunks, &chunk{
			host:   h,
			mem:    unsafe.Slice((*byte)(h), stageChunkSize),
			dev:    dev,
			events: map[*cuda.Device]*cuda.Event{},
		})
	}
	return nil
}

// free waits for the chunks' last DMAs and frees them. Held lock.
func (p *stagePool) free() error {
	var errs []error
	for _, c := range p.chunks {
		errs = append(errs, c.wait())
		for _, e := range c.events {
			errs = append(errs, e.Close())
		}
		errs = append(errs, c.dev.MemFreeHost(c.host))
	}
	p.chunks, p.ready = nil, false
	return errors.Join(errs...)
}

// take returns the chunk for the i-th piece of a copy.
func (p *stagePool) take(i int) *chunk { return p.chunks[(p.next+i)%len(p.chunks)] }

// done ends a copy of n pieces: the next copy starts with the chunk least
// recently used.
func (p *stagePool) done(n int) {
	p.next = (p.next + n) % len(p.chunks)
	p.mu.Unlock()
}

// fail ends a copy that went wrong. Chunks whose DMA may still run without
// an event recorded are waited for through the stream; if even that fails
// the pool is retired and later copies go to the driver directly.
func (p *stagePool) fail(s *cuda.Stream, err error) error {
	serr := s.Sync()
	for _, c := range p.chunks {
		if werr := c.wait(); werr != nil && serr == nil {
			serr = werr
		}
	}
	if serr != nil {
		p.err = serr
	}
	p.mu.Unlock()
	return err
}

// wait blocks until the chunk's last DMA has finished.
func (c *chunk) wait() error {
	if c.pending == nil {
		return nil
	}
	err := c.pending.Sync()
	c.pending = nil
	return err
}

// record marks the end of the chunk's DMA just submitted to s.
func (c *chunk) record(s *cuda.Stream) error {
	d := s.Device()
	e := c.events[d]
	if e == nil {
		var err error
		if e, err = d.NewEvent(cuda.EventDisableTiming); err != nil {
			return err
		}
		c.events[d] = e
	}
	if err := e.Record(s); err != nil {
		return err
	}
	c.pending = e
	return nil
}

// stagedHtoD copies src to dst through the pool, ordered on s. It returns
// once src may be reused; the last DMAs may still run. done is false when
// the pool was not available (nothing was done).
func stagedHtoD(s *cuda.Stream, dst cuda.DevicePtr, src []byte) (done bool, err error) {
	p := &stage
	if !p.acquire(s.Device()) {
		return false, nil
	}
	size, i := p.size, 0
	for off := 0; off < len(src); off, i = off+size, i+1 {
		n := min(size, len(src)-off)
		c := p.take(i)
		if err := c.wait(); err != nil {
			return true, p.fail(s, err)
		}
		parallelCopy(c.mem[:n], src[off:off+n])
		if err := s.MemcpyHtoDAsync(dst+cuda.DevicePtr(off), c.host, uint64(n)); err != nil {
			return true, p.fail(s, err)
		}
		if err := c.record(s); err != nil {
			return true, p.fail(s, err)
		}
	}
	p.done(i)
	return true, nil
}

// stagedDtoH copies src to dst through the pool, ordered on s, and returns
// once dst holds the data. done is false when the pool was not available.
func stagedDtoH(s *cuda.Stream, dst []byte, src cuda.DevicePtr) (done bool, err error) {
	p := &stage
	if !p.acquire(s.Device()) {
		return false, nil
	}
	size := p.size
	pieces := (len(dst) + size - 1) / size
	issue := func(i int) error {
		off := i * size
		n := min(size, len(dst)-off)
		c := p.take(i)
		if err := c.wait(); err != nil {
			return err
		}
		if err := s.MemcpyDtoHAsync(c.host, src+cuda.DevicePtr(off), uint64(n)); err != nil {
			return err
		}
		return c.record(s)
	}
	k := len(p.chunks)
	for i := 0; i < k && i < pieces; i++ {
		if err := issue(i); err != nil {
			return true, p.fail(s, err)
		}
	}
	for i := range pieces {
		off := i * size
		n := min(size, len(dst)-off)
		c := p.take(i)
		if err := c.wait(); err != nil {
			return true, p.fail(s, err)
		}
		parallelCopy(dst[off:off+n], c.mem[:n])
		if i+k < pieces {
			if err := issue(i + k); err != nil {
				return true, p.fail(s, err)
			}
		}
	}
	p.done(pieces)
	return true, nil
}

// copyPiece is the least a goroutine of parallelCopy moves.
const copyPiece = 512 << 10

// parallelCopy is copy(dst, src) split among up to stageWorkers goroutines:
// one core cannot saturate the memory bus.
func parallelCopy(dst, src []byte) {
	n := min(len(dst), len(src))
	w := min(stageWorkers, runtime.GOMAXPROCS(0), n/copyPiece)
	if w <= 1 {
		copy(dst, src)
		return
	}
	piece := (n/w + 4095) &^ 4095
	var wg sync.WaitGroup
	for lo := piece; lo < n; lo += piece {
		hi := min(lo+piece, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			copy(dst[lo:hi], src[lo:hi])
		}()
	}
	copy(dst[:min(piece, n)], src[:min(piece, n)])
	wg.Wait()
}

// resetStaging frees the pool (waiting for its DMAs) and sets its
// parameters for the next allocation; tests and benchmarks use it.
func resetStaging(chunkSize, chunks, workers int) error {
	stage.mu.Lock()
	defer stage.mu.Unlock()
	var err error
	if stage.ready {
		err = stage.free()
	}
	stage.err = nil
	stageChunkSize, stageChunks, stageWorkers = chunkSize, chunks, workers
	return err
}
