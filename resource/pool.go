package resource

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// keepAll is the release threshold that keeps freed memory cached in a
// pool: the pool never gives memory back at synchronization points (RMM's
// default, and what DevicePool sets on a current pool whose threshold is 0).
const keepAll = math.MaxUint64

// PoolAttributes are a memory pool's attributes, read from the driver as
// 64-bit values (cuda.core's DeviceMemoryResourceAttributes).
type PoolAttributes struct {
	// ReuseFollowEventDependencies lets an allocation reuse memory freed on
	// another stream when an event or stream dependency orders the free
	// before it.
	ReuseFollowEventDependencies bool
	// ReuseAllowOpportunistic lets an allocation reuse memory whose free
	// has already completed, with no dependency between them.
	ReuseAllowOpportunistic bool
	// ReuseAllowInternalDependencies lets the driver insert stream
	// dependencies so an allocation can reuse memory freed on another
	// stream.
	ReuseAllowInternalDependencies bool
	// ReleaseThreshold is how many reserved bytes the pool keeps cached at
	// synchronization points before releasing memory to the system.
	ReleaseThreshold uint64
	// ReservedMemCurrent is the memory the pool holds from the system.
	ReservedMemCurrent uint64
	// ReservedMemHigh is the high watermark of ReservedMemCurrent since
	// the pool was created or the watermarks were last reset.
	ReservedMemHigh uint64
	// UsedMemCurrent is the memory handed out to allocations not yet freed.
	UsedMemCurrent uint64
	// UsedMemHigh is the high watermark of UsedMemCurrent.
	UsedMemHigh uint64
}

// poolCore is what DevicePool and PinnedPool share: a driver memory pool,
// whether this value owns it, and the closed state. The outer types wrap
// its methods with nil checks and their own documentation; kind names the
// outer type in errors (it is empty in a zero value, so methods take it).
//
// An owned pool is destroyed only when no allocation from it is live and
// every free has completed: Close destroys it at once when nothing is
// allocated, and otherwise the Deallocate of the last live allocation
// does. Destroying a pool with allocations outstanding, or freeing into a
// destroyed pool, is allowed by the driver's documentation, but in this
// package's tests (driver 580, CUDA 13.0) it was followed by a
// segmentation fault inside a later cuCtxSynchronize; cuda.core likewise
// keeps a pool alive while its buffers are.
type poolCore struct {
	kind  string       // "DevicePool" or "PinnedPool", for error messages
	dev   *cuda.Device // serves the pool's calls; its default stream is the nil-stream default
	pool  cuda.MemPool
	owned bool
	ipc   bool

	// destroy releases an owned pool (revoking access first where needed);
	// quiesce is the devices whose work is waited for before it runs.
	destroy func() error
	quiesce func() []*cuda.Device

	live    atomic.Int64 // allocations made and not yet deallocated
	closing atomic.Bool  // Close was called: the last Deallocate destroys an owned pool

	mu        sync.RWMutex // read-held by calls on the pool; Close takes it exclusively
	closed    bool
	destroyed bool
}

// opErr returns an error for method op of the pool that wraps err.
func (c *poolCore) opErr(op string, err error) error {
	return &cuda.OpError{Op: c.kind + "." + op, Err: err}
}

// errNil is the error for a method called on a nil resource pointer.
func errNil(kind, op string) error {
	return cuda.Errorf(kind+"."+op, cuda.ErrInvalidArgument, "nil *%s", kind)
}

// acquire read-locks the pool for a call. It fails on a nil or zero value
// and after Close; on success release must follow.
func (c *poolCore) acquire(kind, op string) error {
	if c.dev == nil || c.pool.IsZero() {
		return cuda.Errorf(kind+"."+op, cuda.ErrInvalidArgument, "%s is not initialized (create it with New%s)", kind, kind)
	}
	c.mu.RLock()
	if c.closed {
		c.mu.RUnlock()
		return c.opErr(op, cuda.ErrClosed)
	}
	return nil
}

func (c *poolCore) release() { c.mu.RUnlock() }

// allocate is the shared Allocate: stream-ordered from the pool, mr owning
// the returned buffer.
func (c *poolCore) allocate(kind string, mr buffer.MemoryResource, size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	if err := c.acquire(kind, "Allocate"); err != nil {
		return nil, err
	}
	if s == nil {
		s = c.dev.DefaultStream()
	}
	if size == 0 {
		c.release()
		return buffer.Owned(0, 0, mr, s), nil
	}
	ptr, err := s.MemAllocFromPoolAsync(c.pool, size)
	if err == nil {
		c.live.Add(1)
	}
	c.release()
	if err != nil {
		return nil, c.opErr("Allocate", fmt.Errorf("%d bytes from the pool of %v: %w", size, c.where(), err))
	}
	return buffer.Owned(ptr, size, mr, s), nil
}

// deallocate is the shared Deallocate. It works after Close too: an owned
// pool lives until its last allocation is freed, and that free destroys it
// (after waiting for the pool's devices, so the frees have completed).
func (c *poolCore) deallocate(kind string, ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if ptr == 0 {
		return nil
	}
	if c.dev == nil {
		return cuda.Errorf(kind+".Deallocate", cuda.ErrInvalidArgument, "%s is not initialized (create it with New%s)", kind, kind)
	}
	if s == nil {
		s = c.dev.DefaultStream()
	}
	if err := s.MemFreeAsync(ptr); err != nil {
		return c.opErr("Deallocate", fmt.Errorf("%#x (%d bytes): %w", uint64(ptr), size, err))
	}
	if c.live.Add(-1) <= 0 && c.closing.Load() {
		// The free succeeded, so the buffer is closed whatever happens
		// next; if destroying the pool fails, the next Close retries it
		// and reports the error.
		c.mu.Lock()
		_ = c.finishLocked()
		c.mu.Unlock()
	}
	return nil
}

// closeLocked marks the pool closed and destroys an owned pool now if no
// allocation is live (else the last Deallocate does). Once called, the pool
// is closed for use whatever happens; a failed destruction (now, or a
// deferred one) is returned and retried by the next call. The caller holds
// mu exclusively.
func (c *poolCore) closeLocked() error {
	c.closed = true
	c.closing.Store(true)
	if err := c.finishLocked(); err != nil {
		return c.opErr("Close", err)
	}
	return nil
}

// finishLocked destroys a closed owned pool once nothing is live: it waits
// for the devices that may have frees pending, then destroys. The caller
// holds mu exclusively.
func (c *poolCore) finishLocked() error {
	if !c.closed || !c.owned || c.destroyed || c.live.Load() > 0 {
		return nil
	}
	for _, d := range c.quiesce() {
		if err := d.Sync(); err != nil {
			return fmt.Errorf("wait for %v before destroying the pool: %w", d, err)
		}
	}
	if err := c.destroy(); err != nil {
		return err
	}
	c.destroyed = true
	return nil
}

// where describes the pool's location for messages.
func (c *poolCore) where() string {
	if c.kind == "PinnedPool" {
		return "host memory"
	}
	return c.dev.String()
}

// memPool returns the driver pool, or the zero MemPool once closed.
func (c *poolCore) memPool() cuda.MemPool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return cuda.MemPool{}
	}
	return c.pool
}

// isClosed reports whether Close has been called.
func (c *poolCore) isClosed() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.closed
}

// attributes reads all eight pool attributes.
func (c *poolCore) attributes(kind string) (PoolAttributes, error) {
	var a PoolAttributes
	if err := c.acquire(kind, "Attributes"); err != nil {
		return a, err
	}
	defer c.release()
	flag := func(attr cuda.MemPoolAttribute, dst *bool) error {
		v, err := c.pool.Attribute(attr)
		*dst = v != 0
		return err
	}
	val := func(attr cuda.MemPoolAttribute, dst *uint64) error {
		v, err := c.pool.Attribute(attr)
		*dst = v
		return err
	}
	for _, err := range []error{
		flag(cuda.MemPoolAttrReuseFollowEventDependencies, &a.ReuseFollowEventDependencies),
		flag(cuda.MemPoolAttrReuseAllowOpportunistic, &a.ReuseAllowOpportunistic),
		flag(cuda.MemPoolAttrReuseAllowInternalDependencies, &a.ReuseAllowInternalDependencies),
		val(cuda.MemPoolAttrReleaseThreshold, &a.ReleaseThreshold),
		val(cuda.MemPoolAttrReservedMemCurrent, &a.ReservedMemCurrent),
		val(cuda.MemPoolAttrReservedMemHigh, &a.ReservedMemHigh),
		val(cuda.MemPoolAttrUsedMemCurrent, &a.UsedMemCurrent),
		val(cuda.MemPoolAttrUsedMemHigh, &a.UsedMemHigh),
	} {
		if err != nil {
			return PoolAttributes{}, c.opErr("Attributes", err)
		}
	}
	return a, nil
}

// set writes one attribute for method op.
func (c *poolCore) set(kind, op string, attr cuda.MemPoolAttribute, v uint64) error {
	if err := c.acquire(kind, op); err != nil {
		return err
	}
	defer c.release()
	if err := c.pool.SetAttribute(attr, v); err != nil {
		return c.opErr(op, err)
	}
	return nil
}

func flagValue(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// trim releases cached memory until the pool holds at most keep bytes.
func (c *poolCore) trim(kind string, keep uint64) error {
	if err := c.acquire(kind, "Trim"); err != nil {
		return err
	}
	defer c.release()
	if err := c.pool.TrimTo(keep); err != nil {
		return c.opErr("Trim", fmt.Errorf("keep %d bytes: %w", keep, err))
	}
	return nil
}

// resetHighWatermarks sets both *High attributes back to 0 (the only value
// the driver accepts for them), so they track from now on.
func (c *poolCore) resetHighWatermarks(kind string) error {
	if err := c.acquire(kind, "ResetHighWatermarks"); err != nil {
		return err
	}
	defer c.release()
	for _, a := range []cuda.MemPoolAttribute{cuda.MemPoolAttrReservedMemHigh, cuda.MemPoolAttrUsedMemHigh} {
		if err := c.pool.SetAttribute(a, 0); err != nil {
			return c.opErr("ResetHighWatermarks", err)
		}
	}
	return nil
}

// prime makes the pool reserve n bytes up front by allocating and freeing
// them (RMM's initial_pool_size). The release threshold must be at least n
// for the memory to stay reserved.
func prime(pool cuda.MemPool, s *cuda.Stream, n uint64) error {
	if n == 0 {
		return nil
	}
	p, err := s.MemAllocFromPoolAsync(pool, n)
	if err != nil {
		return fmt.Errorf("initial reserve of %d bytes: %w", n, err)
	}
	if err := s.MemFreeAsync(p); err != nil {
		return fmt.Errorf("initial reserve of %d bytes: %w", n, err)
	}
	return s.Sync()
}

// threshold maps an options release threshold to the attribute value: 0
// means keep everything cached.
func threshold(v uint64) uint64 {
	if v == 0 {
		return keepAll
	}
	return v
}

// locString describes a memory location for messages.
func locString(l cuda.MemLocation) string {
	switch l.Type {
	case cuda.MemLocationTypeDevice:
		return fmt.Sprintf("GPU %d", l.ID)
	case cuda.MemLocationTypeHost:
		return "host"
	case cuda.MemLocationTypeHostNUMA:
		return fmt.Sprintf("host NUMA node %d", l.ID)
	case cuda.MemLocationTypeHostNUMACurrent:
		return "host NUMA node of the calling thread"
	}
	return fmt.Sprintf("location type %d (id %d)", l.Type, l.ID)
}
