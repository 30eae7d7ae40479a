package buffer

import (
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/staging"
)

// Host copies from and to ordinary (pageable) Go memory. The driver copies
// pageable memory by staging it through its own pinned buffers, well below
// the bus's speed. Copies of at least stageMinBytes go through a small pool
// of pinned chunks instead: several goroutines move the pieces between the
// Go slice and the chunks while the DMA engine moves the pieces before,
// and an event per chunk says when its DMA has finished so the chunk can
// be refilled (see pipeline).
//
// The pool is allocated on first use (cuMemHostAlloc, portable, so every
// device's context may use it) and kept for the life of the process. One
// copy uses it at a time; a copy that finds it busy goes to the driver's
// own path rather than wait.

// defaultStageMinBytes, defaultStageOutMinBytes and
// defaultStageFreshMinBytes are the smallest copies worth staging by
// default: into a device, out of one, and out of one into fresh memory.
// They come from cudamem bench's hostcopy table (the crossover of the
// driver's pageable copy and the staged one, each way, in two runs): into
// a device the two are within 15% of each other at 4 MiB, either ahead,
// and staging is 1.7x and more from 16 MiB; out of one into memory
// touched before, the driver's copy is ahead at 4 MiB in both runs and
// staging from 16 MiB; into fresh memory (where the driver's own copy
// faults page by page, and a look at two pages tells) staging is
// 1.7-2.3x the driver's from 256 KiB, where at 64 KiB the two are level:
// too little for the shared pool it keeps from a larger copy meanwhile.
const (
	defaultStageMinBytes      = 4 << 20
	defaultStageOutMinBytes   = 16 << 20
	defaultStageFreshMinBytes = 256 << 10
)

// stageMinBytes, stageOutMinBytes and stageFreshMinBytes are the
// smallest copies staged now: into a device, out of one, and out of one
// into fresh memory (see internal/staging).
var stageMinBytes, stageOutMinBytes, stageFreshMinBytes atomic.Int64

func init() {
	stageMinBytes.Store(defaultStageMinBytes)
	stageOutMinBytes.Store(defaultStageOutMinBytes)
	stageFreshMinBytes.Store(defaultStageFreshMinBytes)
	staging.Register(currentStaging, setStaging)
}

// Staging parameters; tests and benchmarks change them through
// resetStaging or staging.Set (never while copies run). A copy reads them
// holding the pool's lock.
var (
	stageChunkSize  = 8 << 20 // bytes per pinned chunk
	stageChunks     = 4       // chunks in the pool
	stageWorkers    = 8       // goroutines moving memory into a device (capped by GOMAXPROCS)
	stageOutWorkers = 8       // and out of one
	// stageFreshWorkers move memory out of a device into fresh pages
	// (0: stageOutWorkers). The kernel's mapping of fresh pages scales
	// with the goroutines faulting them in: 16 workers copy 1 GiB into
	// a fresh slice 1.3-1.4x as fast as 8, where into mapped memory,
	// bound by the memory's bandwidth, 8 beat 16 (cudamem bench's
	// staging sweep, two runs).
	stageFreshWorkers = 16
	// stagePrefault is how a copy out maps its destination's pages
	// ahead of the DMA (see prefault.go).
	stagePrefault = staging.PrefaultPopulate
	// stageHugePages asks for huge pages behind a copy's destination.
	stageHugePages = false
	// stageEager queues a chunk's next DMA as soon as it is emptied.
	stageEager = true
	// stageAhead is how many goroutines map a copy's destination ahead
	// of its workers (0: the workers map their own shares).
	stageAhead = 0
)

// stagingOff sends every host copy to the driver's path (tests and
// benchmarks compare the two).
var stagingOff atomic.Bool

// stagePool is the process's pinned staging memory. A failed copy leaves
// it as it found it for the next one: a failure to get pinned memory sends
// that copy to the driver, and the next copy tries again (a transient
// failure must not slow every later copy down). A chunk whose last DMA a
// failure leaves unsettled is set aside, neither used nor freed since the
// engine may still write it, until a later copy finds that DMA over.
type stagePool struct {
	mu     sync.Mutex // held for a whole staged copy
	chunks []*chunk
	next   int // the chunk used least recently
	size   int // bytes per chunk; 0 until the first chunk is allocated
	want   int // chunks to keep; 0: stageChunks

	// aside holds chunks whose last DMA could not be settled; see reclaim.
	aside []*chunk

	// newChunk allocates a chunk of size bytes through dev; nil (tests'
	// pools of Go memory) means the pool never grows.
	newChunk func(dev *cuda.Device, size int) (*chunk, error)
	allocErr error        // the last allocation failure, for tests
	freeErr  error        // the last failure to free a reclaimed chunk, for tests
	staged   atomic.Int64 // copies that went through the pool
}

type chunk struct {
	host    unsafe.Pointer // cuMemHostAlloc'd
	mem     []byte         // the same memory
	dev     *cuda.Device   // allocated through this device's context
	events  map[*cuda.Device]*cuda.Event
	pending waiter // marks the end of the chunk's last DMA; nil when idle

	// queued: a DMA on the current copy's queue uses the chunk and no
	// event marks its end yet; draining that queue settles it.
	queued bool
	// lost: waiting for the chunk's last DMA failed, so when it ends is
	// unknown until pending says so; until then the chunk must be neither
	// used nor freed.
	lost bool
	// released: release was called; the chunk never returns to the pool.
	released bool
}

// waiter is a point in a queue of DMAs (a recorded cuda.Event, or all the
// work queued on a stream).
type waiter interface{ Sync() error }

// poller is a waiter that can also be asked, without blocking, whether
// its point has passed (cuda.Event.Done, cuda.Stream.Done).
type poller interface{ Done() (bool, error) }

// dmaQueue is what a staged copy needs of a stream. streamQueue is the
// real one; tests drive the pipelines with a fake DMA engine.
type dmaQueue interface {
	htod(dst cuda.DevicePtr, src unsafe.Pointer, n uint64) error
	dtoh(dst unsafe.Pointer, src cuda.DevicePtr, n uint64) error
	record(c *chunk) error // set c.pending to the end of the work queued so far
	sync() error
	// tail is a waiter for all the work queued so far, for a chunk whose
	// DMA has no event and whose queue could not be drained now.
	tail() waiter
}

type streamQueue struct{ s *cuda.Stream }

func (q streamQueue) htod(dst cuda.DevicePtr, src unsafe.Pointer, n uint64) error {
	return q.s.MemcpyHtoDAsync(dst, src, n)
}

func (q streamQueue) dtoh(dst unsafe.Pointer, src cuda.DevicePtr, n uint64) error {
	return q.s.MemcpyDtoHAsync(dst, src, n)
}

func (q streamQueue) record(c *chunk) error { return c.record(q.s) }
func (q streamQueue) sync() error           { return q.s.Sync() }
func (q streamQueue) tail() waiter          { return streamTail(q) }

// streamTail is the end of the work queued on a stream. When the stream
// cannot answer (it was closed since, say), the whole device is waited
// for: that covers every stream of its context, destroyed ones included.
type streamTail struct{ s *cuda.Stream }

func (w streamTail) Sync() error {
	err := w.s.Sync()
	if err == nil {
		return nil
	}
	if d := w.s.Device(); d != nil && d.Sync() == nil {
		return nil
	}
	return err
}

func (w streamTail) Done() (bool, error) {
	done, err := w.s.Done()
	if err == nil {
		return done, nil
	}
	if d := w.s.Device(); d != nil && d.Sync() == nil {
		return true, nil
	}
	return false, err
}

var stage = stagePool{newChunk: allocChunk}

// acquire locks the pool for one copy, first taking back the chunks set
// aside whose DMAs are over and topping the pool up to its size. It
// returns false, holding no lock, when the pool is busy, or has no chunk
// and cannot get one now.
func (p *stagePool) acquire(dev *cuda.Device) (ok bool) {
	if !p.mu.TryLock() {
		return false
	}
	defer func() {
		if !ok {
			p.mu.Unlock()
		}
	}()
	want := p.want
	if want == 0 {
		want = stageChunks
	}
	if p.size == 0 {
		p.size, p.next = stageChunkSize, 0
	}
	p.reclaim(want)
	if len(p.chunks) < want && p.newChunk != nil {
		// No backoff: a failed allocation costs one driver call per large
		// copy.
		p.allocErr = p.grow(dev, want)
	}
	return len(p.chunks) > 0
}

// reclaim takes back the chunks set aside whose last DMA is now over:
// into the pool while it holds fewer than want, else they are freed. The
// others stay aside for the next copy. Held lock.
func (p *stagePool) reclaim(want int) {
	if len(p.aside) == 0 {
		return
	}
	keep := p.aside[:0]
	for _, c := range p.aside {
		switch {
		case !c.settled():
			keep = append(keep, c)
		case !c.released && len(c.mem) == p.size && len(p.chunks) < want:
			p.chunks = append(p.chunks, c)
		default:
			if err := c.release(); err != nil {
				p.freeErr = err
				keep = append(keep, c)
			}
		}
	}
	clear(p.aside[len(keep):])
	p.aside = keep
}

// grow allocates chunks until the pool holds want. The chunks it got
// before a failure stay: they are good, and a smaller pool still works.
func (p *stagePool) grow(dev *cuda.Device, want int) error {
	for len(p.chunks) < want {
		c, err := p.newChunk(dev, p.size)
		if err != nil {
			return err
		}
		p.chunks = append(p.chunks, c)
	}
	return nil
}

// allocChunk allocates a chunk of pinned memory usable from every
// device's context, through the GPU's primary context whatever view dev
// is: the pool outlives any context made with cuda.Device.NewContext.
func allocChunk(dev *cuda.Device, size int) (*chunk, error) {
	if dev == nil {
		return nil, cuda.Errorf("buffer staging", cuda.ErrInvalidArgument, "no device to allocate pinned memory through")
	}
	if p := dev.Primary(); p != nil {
		dev = p
	}
	h, err := dev.MemHostAlloc(uint64(size), cuda.MemHostAllocPortable)
	if err != nil {
		return nil, err
	}
	return &chunk{
		host:   h,
		mem:    unsafe.Slice((*byte)(h), size),
		dev:    dev,
		events: map[*cuda.Device]*cuda.Event{},
	}, nil
}

// free waits for the last DMAs of every chunk (those set aside too) and
// frees them. Held lock. A chunk that cannot be waited for or freed stays
// aside for a later copy, and its error is returned.
func (p *stagePool) free() error {
	var errs []error
	all := append(p.chunks, p.aside...)
	p.chunks, p.aside, p.next, p.size = nil, nil, 0, 0
	for _, c := range all {
		if err := c.wait(); err != nil {
			errs = append(errs, err)
			p.aside = append(p.aside, c)
			continue
		}
		if err := c.release(); err != nil {
			errs = append(errs, err)
			p.aside = append(p.aside, c)
		}
	}
	return errors.Join(errs...)
}

// release frees the chunk's events and pinned memory. What fails to free
// stays for the next call, so retrying frees nothing twice.
func (c *chunk) release() error {
	c.released = true
	var errs []error
	for d, e := range c.events {
		if err := e.Close(); err != nil {
			errs = append(errs, err)
			continue
		}
		delete(c.events, d)
	}
	if c.host != nil && c.dev != nil {
		if err := c.dev.MemFreeHost(c.host); err != nil {
			return errors.Join(append(errs, err)...)
		}
	}
	c.host, c.mem = nil, nil
	return errors.Join(errs...)
}

// take returns the chunk for the i-th piece of a copy.
func (p *stagePool) take(i int) *chunk { return p.chunks[(p.next+i)%len(p.chunks)] }

// done ends a copy of n pieces: the next copy starts with the chunk least
// recently used.
func (p *stagePool) done(n int) {
	p.next = (p.next + n) % len(p.chunks)
	p.staged.Add(1)
	p.mu.Unlock()
}

// fail ends a copy that went wrong and returns err. Every chunk is left
// settled or with a waiter for its last DMA:
//   - chunks with a DMA queued on q and no event recorded are settled by
//     draining q; if that fails, their waiter is the end of q (see
//     streamTail);
//   - chunks whose event wait failed are waited for once more (a failure
//     may be transient);
//   - chunks with an event recorded need nothing: their next user waits.
//
// A chunk still unsettled is set aside (see reclaim).
func (p *stagePool) fail(q dmaQueue, err error) error {
	// Deferred, so that even a panic in q unlocks the pool and leaves no
	// unsettled chunk in use.
	defer p.mu.Unlock()
	drained := false
	defer func() {
		keep := p.chunks[:0]
		for _, c := range p.chunks {
			if c.queued {
				c.queued = false
				if drained {
					c.pending = nil // its only DMA not waited for was on q
				} else {
					c.pending, c.lost = q.tail(), true
				}
			}
			if c.lost && c.pending != nil && c.pending.Sync() == nil {
				c.pending, c.lost = nil, false
			}
			if c.lost {
				p.aside = append(p.aside, c)
				continue
			}
			keep = append(keep, c)
		}
		clear(p.chunks[len(keep):])
		p.chunks, p.next = keep, 0
	}()
	for _, c := range p.chunks {
		if c.queued {
			drained = q.sync() == nil
			break
		}
	}
	return err
}

// wait blocks until the chunk's last DMA has finished. If that cannot be
// known, the chunk is marked lost (fail and reclaim try again later).
func (c *chunk) wait() error {
	if c.pending == nil {
		return nil
	}
	if err := c.pending.Sync(); err != nil {
		c.lost = true
		return err
	}
	c.pending, c.lost = nil, false
	return nil
}

// settled reports whether the chunk's last DMA is known to be over,
// without blocking where its waiter can poll.
func (c *chunk) settled() bool {
	if c.pending == nil {
		c.lost = false
		return true
	}
	if pl, ok := c.pending.(poller); ok {
		if done, err := pl.Done(); err != nil || !done {
			return false
		}
	} else if c.pending.Sync() != nil {
		return false
	}
	c.pending, c.lost = nil, false
	return true
}

// record marks the end of the chunk's DMA just submitted to s.
func (c *chunk) record(s *cuda.Stream) error {
	d := s.Device()
	if d == nil {
		_, err := d.ResolveStream("buffer staging", s, false) // the one zero-stream error
		return err
	}
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

// pipeline is one staged copy's plan: the copy is cut into pieces (at most
// a chunk each), piece i goes through chunk i mod len(chunks), and every
// worker goroutine moves its stripe of every piece in order. The goroutine
// that drives the DMAs opens a piece to the workers (open) once its chunk
// is free (host to device) or filled (device to host); the last worker to
// finish a piece closes done. Workers run ahead through the open pieces
// without waiting for each other, so the CPU cores stay busy while the DMA
// engine and the driver calls proceed.
type pipeline struct {
	pool                      *stagePool
	n, piece, pieces, workers int
	ready, done               []chan struct{}
	count                     []atomic.Int32
	abort                     chan struct{}
	wg                        sync.WaitGroup
	// before, when set, runs for a worker's stripe of a piece before the
	// piece is open, while its DMA may still run (see prefault.go).
	before func(off, lo, hi int)
	eager  bool // see stageEager
	prof   bool // staging.Profile was on when the copy started
}

// newPipeline plans a copy of n bytes through p's k chunks by workers
// goroutines (capped by GOMAXPROCS). Small copies use smaller pieces, so
// that moving and DMA still overlap.
func newPipeline(p *stagePool, n, workers int) *pipeline {
	size, k := p.size, len(p.chunks)
	piece := (n + 2*k - 1) / (2 * k)
	piece = (piece + 64<<10 - 1) &^ (64<<10 - 1)
	piece = max(min(piece, size), min(256<<10, size))
	pieces := (n + piece - 1) / piece
	l := &pipeline{
		pool: p, n: n, piece: piece, pieces: pieces,
		workers: max(1, min(workers, runtime.GOMAXPROCS(0))),
		ready:   make([]chan struct{}, pieces),
		done:    make([]chan struct{}, pieces),
		count:   make([]atomic.Int32, pieces),
		abort:   make(chan struct{}),
		prof:    staging.Profile.Load(),
	}
	for i := range pieces {
		l.ready[i], l.done[i] = make(chan struct{}), make(chan struct{})
	}
	return l
}

// span is piece i's byte range in the copy.
func (l *pipeline) span(i int) (off, n int) {
	off = i * l.piece
	return off, min(l.piece, l.n-off)
}

// stripe is worker w's share [lo, hi) of piece i, which starts at off in
// the copy; empty when lo >= hi.
func (l *pipeline) stripe(i, w int) (off, lo, hi int) {
	off, n := l.span(i)
	lo = (n * w / l.workers) &^ 63
	hi = n
	if w+1 < l.workers {
		hi = (n * (w + 1) / l.workers) &^ 63
	}
	return off, lo, hi
}

// clock and tally time what the counters of internal/staging sum, only
// while they are on.
func (l *pipeline) clock() time.Time {
	if !l.prof {
		return time.Time{}
	}
	return time.Now()
}

func (l *pipeline) tally(c *atomic.Int64, since time.Time) {
	if l.prof {
		c.Add(int64(time.Since(since)))
	}
}

// start runs the workers; move(c, off, lo, hi) moves bytes [lo, hi) of
// the piece at off in the copy, through chunk c.
func (l *pipeline) start(move func(c *chunk, off, lo, hi int)) {
	for w := range l.workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := range l.pieces {
				off, lo, hi := l.stripe(i, w)
				if l.before != nil && lo < hi {
					t := l.clock()
					l.before(off, lo, hi)
					l.tally(&staging.PrefaultNs, t)
				}
				t := l.clock()
				select {
				case <-l.ready[i]:
				case <-l.abort:
					return
				}
				l.tally(&staging.IdleNs, t)
				if lo < hi {
					t := l.clock()
					move(l.pool.take(i), off, lo, hi)
					l.tally(&staging.MoveNs, t)
				}
				if int(l.count[i].Add(1)) == l.workers {
					close(l.done[i])
				}
			}
		}()
	}
}

// open lets the workers at piece i once its chunk's last DMA is over.
func (l *pipeline) open(i int) error {
	t := l.clock()
	err := l.pool.take(i).wait()
	l.tally(&staging.WaitNs, t)
	if err != nil {
		return err
	}
	close(l.ready[i])
	return nil
}

// landed reports, without blocking, whether piece i's chunk has no DMA
// left to wait for; false where its waiter cannot be asked. A failure to
// ask is the copy's error, as a failed wait would be.
func (l *pipeline) landed(i int) (bool, error) {
	c := l.pool.take(i)
	if c.pending == nil {
		return true, nil
	}
	pl, ok := c.pending.(poller)
	if !ok {
		return false, nil
	}
	return pl.Done()
}

// submitted follows the DMA of chunk c just submitted to q (err: how the
// submission went) with an event that marks its end.
func (c *chunk) submitted(q dmaQueue, err error) error {
	if err != nil {
		return err
	}
	c.queued = true // until an event marks the DMA's end
	if err := q.record(c); err != nil {
		return err
	}
	c.queued = false
	return nil
}

// copyDir is the direction of a staged copy.
type copyDir bool

const (
	intoDevice  copyDir = true
	outOfDevice copyDir = false
)

// runCopy runs one staged copy of n bytes through pool p on q, a stream of
// dev: the workers move the bytes (move), and drive queues the DMAs and
// opens the pieces to the workers. dst is the Go memory a copy out of the
// device fills (prefaulted as the parameters say). done is false when the
// pool was not available (nothing was done). When drive fails, or panics
// in q, the workers stop and the pool is left usable (fail).
func (p *stagePool) runCopy(q dmaQueue, dev *cuda.Device, n int, dir copyDir, dst []byte, move func(c *chunk, off, lo, hi int), drive func(l *pipeline, k int) error) (done bool, err error) {
	if !p.acquire(dev) {
		return false, nil
	}
	// The parameters are read holding the pool's lock (setStaging takes it).
	workers := stageWorkers
	if dir == outOfDevice {
		if stageOutWorkers > 0 {
			workers = stageOutWorkers
		}
		if stageFreshWorkers > 0 && fresh(dst) {
			workers = stageFreshWorkers
		}
	}
	l := newPipeline(p, n, workers)
	if dir == outOfDevice {
		l.eager = stageEager
		if stageHugePages {
			adviseHugePages(dst)
		}
		switch pf := stagePrefault; {
		case stageAhead > 0 && pf == staging.PrefaultPopulate:
			l.startAhead(dst, stageAhead)
		case pf != staging.PrefaultOff:
			l.before = func(off, lo, hi int) { prefault(dst[off+lo:off+hi], pf) }
		}
	}
	l.start(move)
	failed := true
	defer func() {
		if failed {
			l.stop()
			err = p.fail(q, err)
		}
	}()
	if err := drive(l, len(p.chunks)); err != nil {
		return true, err
	}
	l.wg.Wait()
	failed = false
	if l.prof {
		staging.Copies.Add(1)
		staging.Bytes.Add(int64(n))
		staging.Workers.Add(int64(l.workers))
	}
	p.done(l.pieces)
	return true, nil
}

// stop ends the workers early (after a failure) and waits for them.
func (l *pipeline) stop() {
	close(l.abort)
	l.wg.Wait()
}

// startAhead runs n goroutines that map dst's pages piece by piece, each
// its stripe of every piece, ahead of the workers (populate never changes
// the bytes, so the order does not matter); they stop at the copy's end
// or abort, and the copy waits for them (l.wg).
func (l *pipeline) startAhead(dst []byte, n int) {
	for w := range n {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for i := range l.pieces {
				select {
				case <-l.abort:
					return
				case <-l.done[i]:
					continue // the workers got there first
				default:
				}
				off, size := l.span(i)
				lo := (size * w / n) &^ 63
				hi := size
				if w+1 < n {
					hi = (size * (w + 1) / n) &^ 63
				}
				if lo < hi {
					t := l.clock()
					populateAhead(dst[off+lo : off+hi])
					l.tally(&staging.PrefaultNs, t)
				}
			}
		}()
	}
}

// stagedHtoD copies src to dst through pool p (the process's, outside
// tests) on q, a stream of dev. It returns once src may be reused; the last
// DMAs may still run.
func stagedHtoD(p *stagePool, q dmaQueue, dev *cuda.Device, dst cuda.DevicePtr, src []byte) (done bool, err error) {
	move := func(c *chunk, off, lo, hi int) { copy(c.mem[lo:hi], src[off+lo:off+hi]) }
	return p.runCopy(q, dev, len(src), intoDevice, nil, move, func(l *pipeline, k int) error {
		for j := range min(k, l.pieces) {
			if err := l.open(j); err != nil {
				return err
			}
		}
		// With two chunks or more, the chunk of the piece before is
		// reopened after the DMA of this piece is queued, so the engine
		// never idles.
		lag := min(1, k-1)
		for i := range l.pieces {
			<-l.done[i]
			c := p.take(i)
			off, n := l.span(i)
			if err := c.submitted(q, q.htod(dst+cuda.DevicePtr(off), c.host, uint64(n))); err != nil {
				return err
			}
			if j := i - lag + k; i >= lag && j < l.pieces {
				if err := l.open(j); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// stagedDtoH copies src to dst through pool p on q, a stream of dev, and
// returns once dst holds the data.
func stagedDtoH(p *stagePool, q dmaQueue, dev *cuda.Device, dst []byte, src cuda.DevicePtr) (done bool, err error) {
	move := func(c *chunk, off, lo, hi int) { copy(dst[off+lo:off+hi], c.mem[lo:hi]) }
	return p.runCopy(q, dev, len(dst), outOfDevice, dst, move, func(l *pipeline, k int) error {
		issue := func(j int) error {
			c := p.take(j)
			if err := c.wait(); err != nil {
				return err
			}
			off, n := l.span(j)
			return c.submitted(q, q.dtoh(c.host, src+cuda.DevicePtr(off), uint64(n)))
		}
		// The first k pieces are queued at once. Then piece i is opened
		// to the workers as its DMA lands, and once the workers are done
		// with piece i-1 its chunk takes piece i-1+k: while the workers
		// move piece i, the DMAs of the next k-1 pieces stay queued, so
		// neither the engine nor the cores wait for this goroutine.
		for j := range min(k, l.pieces) {
			if err := issue(j); err != nil {
				return err
			}
		}
		// refill waits for the workers to finish piece i-1, then queues
		// the piece its chunk takes next.
		refill := func(i int) error {
			<-l.done[i-1]
			if j := i - 1 + k; j < l.pieces {
				return issue(j)
			}
			return nil
		}
		for i := range l.pieces {
			if i > 0 && k == 1 {
				// One chunk: piece i can only be queued once the
				// workers have moved piece i-1 out of it.
				if err := refill(i); err != nil {
					return err
				}
			}
			refilled := i == 0 || k == 1
			if l.eager && !refilled {
				// Eager: while piece i's DMA runs, refill the chunk of
				// piece i-1 the moment the workers empty it, so the
				// engine keeps k-1 DMAs queued rather than k-2.
				var err error
				if refilled, err = l.refillWhileWaiting(i, refill); err != nil {
					return err
				}
			}
			if err := l.open(i); err != nil {
				return err
			}
			if !refilled {
				if err := refill(i); err != nil {
					return err
				}
			}
		}
		return nil
	})
}

// refillWhileWaiting polls until piece i's DMA has landed or the workers
// are done with piece i-1, whichever comes first; in the second case it
// refills (see stagedDtoH) and reports true.
func (l *pipeline) refillWhileWaiting(i int, refill func(i int) error) (refilled bool, err error) {
	t := l.clock()
	defer l.tally(&staging.WaitNs, t)
	for spins := 0; ; spins++ {
		select {
		case <-l.done[i-1]:
			return true, refill(i)
		default:
		}
		if done, err := l.landed(i); done || err != nil {
			return false, err
		}
		if spins > 64 {
			runtime.Gosched()
		}
	}
}

// copyPiece is the least a goroutine of parallelCopy moves.
const copyPiece = 256 << 10

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
	err := stage.free()
	stage.allocErr, stage.freeErr = nil, nil
	stageChunkSize, stageChunks, stageWorkers = chunkSize, chunks, workers
	return err
}

// currentStaging returns the staging parameters (for internal/staging).
func currentStaging() staging.Params {
	stage.mu.Lock()
	defer stage.mu.Unlock()
	out := stageWorkers
	if stageOutWorkers > 0 {
		out = stageOutWorkers
	}
	return staging.Params{
		MinBytes: int(stageMinBytes.Load()), OutMinBytes: int(stageOutMinBytes.Load()), FreshMinBytes: int(stageFreshMinBytes.Load()),
		ChunkSize: stageChunkSize, Chunks: stageChunks,
		InWorkers: stageWorkers, OutWorkers: out, FreshWorkers: stageFreshWorkers,
		Prefault: stagePrefault, HugePages: stageHugePages, Eager: stageEager,
		Ahead: stageAhead,
	}
}

// setStaging sets the staging parameters (for internal/staging, which
// checked them). It waits for the copy in progress; a new pool shape
// frees the pool, and the next copy allocates the new one.
func setStaging(p staging.Params) error {
	stage.mu.Lock()
	defer stage.mu.Unlock()
	var err error
	if p.ChunkSize != stageChunkSize || p.Chunks != stageChunks {
		err = stage.free()
		stage.allocErr, stage.freeErr = nil, nil
	}
	stageMinBytes.Store(int64(p.MinBytes))
	stageOutMinBytes.Store(int64(p.OutMinBytes))
	stageFreshMinBytes.Store(int64(p.FreshMinBytes))
	stageChunkSize, stageChunks = p.ChunkSize, p.Chunks
	stageWorkers, stageOutWorkers, stageFreshWorkers = p.InWorkers, p.OutWorkers, p.FreshWorkers
	stagePrefault, stageHugePages, stageEager, stageAhead = p.Prefault, p.HugePages, p.Eager, p.Ahead
	return err
}
