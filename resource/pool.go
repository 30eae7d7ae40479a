package resource

import (
	"errors"
	"fmt"
	"math"
	"math/bits"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/poolcore"
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

// poolCore is what DevicePool, PinnedPool and ManagedPool share: a driver memory pool,
// whether this value owns it, and its lifecycle (internal/poolcore, shared
// with ipc.ImportedPool). The outer types give its methods their
// documentation; kind names the outer type in errors (it is empty in a
// zero value, so methods take it), and a nil *poolCore is a nil outer
// pool.
type poolCore struct {
	kind string       // "DevicePool", "PinnedPool" or "ManagedPool", for error messages
	dev  *cuda.Device // serves the pool's calls; its default stream is the nil-stream default
	pool cuda.MemPool
	ipc  bool
	// maxSize is an owned pool's MaxSize (0: none): a request above it
	// can never fit.
	maxSize uint64
	life    poolcore.Core
	ptrs    ptrSet // the live allocations' addresses: Deallocate frees only these
}

// own makes c own its pool: once closed and unused, the pool's pending
// work on the quiesce devices is waited for, then destroy runs. While a
// stream of one of those devices captures, that wait would invalidate the
// capture: the destruction is put off until the EndCapture that ends the
// last capture (cuda.Device.DeferWhileCapturing).
func (c *poolCore) own(quiesce []*cuda.Device, destroy func() error) {
	retry := func() { _ = c.life.Retry() }
	c.life.SetName(func() string { return fmt.Sprintf("%s %#x on %s", c.kind, c.pool.Handle(), c.where()) })
	c.life.SetDestroy(func() error {
	quiesce:
		for _, d := range quiesce {
			if d.DeferWhileCapturing(retry) {
				return poolcore.ErrDeferred
			}
		}
		for _, d := range quiesce {
			if err := d.Sync(); err != nil {
				if errors.Is(err, cuda.ErrCapturing) {
					// A capture began since the check: defer after all.
					goto quiesce
				}
				return fmt.Errorf("wait for %v before destroying the pool: %w", d, err)
			}
		}
		return destroy()
	})
}

// opErr returns an error for method op of the pool that wraps err.
func (c *poolCore) opErr(op string, err error) error {
	return &cuda.OpError{Op: c.kind + "." + op, Err: err}
}

// errNil is the error for a method called on a nil resource pointer.
func errNil(kind, op string) error {
	return cuda.Errorf(kind+"."+op, cuda.ErrInvalidArgument, "nil *%s", kind)
}

// initialized reports whether c was made by a constructor.
func (c *poolCore) initialized() bool { return c.dev != nil && !c.pool.IsZero() }

// checkDevice rejects a nil device and one not made by package cuda (a
// zero cuda.Device lacks the driver table): dev must be what
// cuda.GetDevice returns for its ordinal, or a view of that GPU through
// another context, whose primary view is that value.
func checkDevice(op string, dev *cuda.Device) error {
	if dev == nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil device")
	}
	real, err := cuda.GetDevice(dev.Ordinal())
	if err != nil {
		return &cuda.OpError{Op: op, Err: err}
	}
	if real != dev.Primary() {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "device %v is not one cuda.GetDevice returned (a zero or copied cuda.Device)", dev)
	}
	return nil
}

// errZero is the error for method op called on a zero value of type kind.
func errZero(kind, op string) error {
	return cuda.Errorf(kind+"."+op, cuda.ErrInvalidArgument, "%s is not initialized (create it with New%s)", kind, kind)
}

// acquire starts a call on the pool. It fails on a nil or zero value and
// once Close has begun; on success c.life.Leave must follow. It never blocks,
// so calls nested inside Use cannot deadlock against a waiting Close.
func (c *poolCore) acquire(kind, op string) error {
	if c == nil {
		return errNil(kind, op)
	}
	if !c.initialized() {
		return errZero(kind, op)
	}
	if !c.life.Enter() {
		return c.opErr(op, cuda.ErrClosed)
	}
	return nil
}

// use runs fn with the pool held open: Close waits for fn to return before
// it destroys the pool.
func (c *poolCore) use(kind string, fn func(pool cuda.MemPool) error) error {
	if c != nil && fn == nil { // a nil pool is reported first
		return cuda.Errorf(kind+".Use", cuda.ErrInvalidArgument, "nil function")
	}
	if err := c.acquire(kind, "Use"); err != nil {
		return err
	}
	defer c.life.Leave()
	return fn(c.pool)
}

// maxRequest is the largest size this package passes to the driver:
// sizes travel as uintptr (32 bits on some targets), and the driver's
// rounding wraps past 2^64 for sizes near it. No machine has 2^63 bytes.
const maxRequest = min(uint64(^uintptr(0)), 1<<63)

// checkSize rejects a size of argument name of op that the driver call
// would truncate or round past 2^64.
func checkSize(op, name string, size uint64) error {
	if size > maxRequest {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%s %d exceeds the largest size the driver can be asked for (%d on this %d-bit target)", name, size, maxRequest, bits.UintSize)
	}
	return nil
}

// checkPoolSizes validates the sizes both pools' options share.
func checkPoolSizes(op string, reserve, maxSize, release uint64) error {
	if err := checkSize(op, "InitialReserve", reserve); err != nil {
		return err
	}
	if err := checkSize(op, "MaxSize", maxSize); err != nil {
		return err
	}
	if maxSize != 0 && reserve > maxSize {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "InitialReserve %d exceeds MaxSize %d", reserve, maxSize)
	}
	if t := threshold(release); reserve > t {
		return cuda.Errorf(op, cuda.ErrInvalidArgument,
			"InitialReserve %d exceeds ReleaseThreshold %d: the pool would release the reserve at the next synchronization", reserve, t)
	}
	return nil
}

// opName is kind+"."+method, as constants for the hot methods: a
// concatenation on every pair would cost an allocation.
func opName(kind, method string) string {
	switch {
	case kind == "DevicePool" && method == "Allocate":
		return "DevicePool.Allocate"
	case kind == "DevicePool" && method == "Deallocate":
		return "DevicePool.Deallocate"
	case kind == "PinnedPool" && method == "Allocate":
		return "PinnedPool.Allocate"
	case kind == "PinnedPool" && method == "Deallocate":
		return "PinnedPool.Deallocate"
	case kind == "ManagedPool" && method == "Allocate":
		return "ManagedPool.Allocate"
	case kind == "ManagedPool" && method == "Deallocate":
		return "ManagedPool.Deallocate"
	}
	return kind + "." + method
}

// allocatePtr is the shared AllocatePtr: stream-ordered from the pool, the
// address (0 for size 0) and the stream it is ordered on, nil resolved. A
// DevicePool takes streams of its own device only. record adds the
// address to ptrs, which Deallocate requires; a Buffer from
// buffer.Allocate (ForBuffers) is the record of its memory instead.
func (c *poolCore) allocatePtr(kind string, size uint64, s *cuda.Stream, record bool) (cuda.DevicePtr, *cuda.Stream, error) {
	if err := c.acquire(kind, "Allocate"); err != nil {
		return 0, nil, err
	}
	op := opName(kind, "Allocate")
	s, err := c.dev.ResolveStream(op, s, kind == "DevicePool")
	if err == nil {
		err = checkSize(op, "size", size)
	}
	if err == nil {
		err = refuseCapture(op, s)
	}
	if err != nil {
		c.life.Leave()
		return 0, nil, err
	}
	if size == 0 {
		c.life.Leave()
		return 0, s, nil
	}
	ptr, err := s.MemAllocFromPoolAsync(c.pool, size)
	if err != nil && errors.Is(err, cuda.ErrorOutOfMemory) {
		ptr, err = c.retryAfterTrim(s, size, err) // pool_oom.go
	}
	if err == nil {
		if record {
			c.ptrs.add(ptr, size)
		}
		c.life.Allocated()
	}
	c.life.Leave()
	if err != nil {
		return 0, nil, c.opErr("Allocate", fmt.Errorf("%d bytes from the pool of %v: %w", size, c.where(), err))
	}
	return ptr, s, nil
}

// deallocate is the shared Deallocate. It works after Close too: an owned
// pool lives until its last allocation is freed, and that free destroys
// it. An address this value did not hand out, or already freed, is
// refused without calling the driver (see ptrSet): cuMemFreeAsync would
// free another pool's memory behind its back. recorded is false for the
// memory of a Buffer from buffer.Allocate (ForBuffers), which the Buffer
// frees once, and only it can.
func (c *poolCore) deallocate(kind string, ptr cuda.DevicePtr, size uint64, s *cuda.Stream, recorded bool) error {
	if ptr == 0 {
		return nil
	}
	if c == nil {
		return errNil(kind, "Deallocate")
	}
	if !c.initialized() {
		return errZero(kind, "Deallocate")
	}
	if !c.life.HasLive() {
		return cuda.Errorf(kind+".Deallocate", cuda.ErrInvalidArgument,
			"%#x (%d bytes) is not an allocation of this %s: none is live (freed twice, or allocated elsewhere)", uint64(ptr), size, kind)
	}
	op := opName(kind, "Deallocate")
	s, err := c.dev.ResolveStream(op, s, false)
	if err != nil {
		return err
	}
	if err := refuseCapture(op, s); err != nil {
		return fmt.Errorf("%w (%#x, %d bytes, stays allocated)", err, uint64(ptr), size)
	}
	// Taken out before the free, so that two frees of one address cannot
	// both reach the driver; put back if the free fails.
	var got uint64
	if recorded {
		var ok bool
		if got, ok = c.ptrs.take(ptr); !ok {
			return cuda.Errorf(op, cuda.ErrInvalidArgument,
				"%#x (%d bytes) is not a live allocation of this %s (%s) handed out as a pointer: freed already, owned by a Buffer, or allocated elsewhere", uint64(ptr), size, kind, c.where())
		}
	}
	if err := s.MemFreeAsync(ptr); err != nil {
		if recorded {
			c.ptrs.add(ptr, got)
		}
		return c.opErr("Deallocate", fmt.Errorf("%#x (%d bytes): %w", uint64(ptr), size, err))
	}
	// The free succeeded, so the buffer is closed whatever happens next;
	// if destroying the pool now fails, the error is kept and the next
	// Close retries it and reports it.
	_ = c.life.Freed()
	return nil
}

// close marks the pool closed, waits for calls in progress, and destroys
// an owned pool now if no allocation is live (else the last Deallocate
// does). Once called, the pool is closed for use whatever happens; a
// failed destruction (now, or a deferred one) is returned and retried by
// the next call.
func (c *poolCore) close() error {
	if err := c.life.Close(); err != nil {
		return c.opErr("Close", err)
	}
	return nil
}

// where describes the pool's location for messages.
func (c *poolCore) where() string {
	switch c.kind {
	case "PinnedPool":
		return "host memory"
	case "ManagedPool":
		return "managed memory of " + c.dev.String()
	}
	return c.dev.String()
}

// memPool returns the driver pool, or the zero MemPool once closed (or
// for a nil c).
func (c *poolCore) memPool() cuda.MemPool {
	if c == nil || c.life.IsClosed() {
		return cuda.MemPool{}
	}
	return c.pool
}

// attributes reads all eight pool attributes.
func (c *poolCore) attributes(kind string) (PoolAttributes, error) {
	var a PoolAttributes
	if err := c.acquire(kind, "Attributes"); err != nil {
		return a, err
	}
	defer c.life.Leave()
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
	defer c.life.Leave()
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
	defer c.life.Leave()
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
	defer c.life.Leave()
	for _, a := range []cuda.MemPoolAttribute{cuda.MemPoolAttrReservedMemHigh, cuda.MemPoolAttrUsedMemHigh} {
		if err := c.pool.SetAttribute(a, 0); err != nil {
			return c.opErr("ResetHighWatermarks", err)
		}
	}
	return nil
}

// prime makes the pool reserve n bytes up front by allocating and freeing
// them (RMM's initial_pool_size); the release threshold must be at least
// n. clean reports whether the pool may be destroyed after an error:
// destroying a pool under a live allocation or a pending free was
// followed by crashes in the driver, so on failure prime first retries
// the free and waits for the whole device, and says clean only then
// (otherwise the pool is left behind, and the error says so). The
// retries' errors are joined to the first.
func prime(pool cuda.MemPool, s *cuda.Stream, n uint64) (clean bool, err error) {
	if n == 0 {
		return true, nil
	}
	p, err := s.MemAllocFromPoolAsync(pool, n)
	if err != nil {
		return true, fmt.Errorf("initial reserve of %d bytes: %w", n, err)
	}
	if err := s.MemFreeAsync(p); err != nil {
		err = fmt.Errorf("initial reserve of %d bytes: free: %w", n, err)
		// The allocation is still live: free it again, then wait for the
		// device so that the free has completed before the caller
		// destroys the pool.
		if rerr := s.MemFreeAsync(p); rerr != nil {
			return false, errors.Join(err, fmt.Errorf("free it again: %w", rerr))
		}
		if serr := s.Device().Sync(); serr != nil {
			return false, errors.Join(err, fmt.Errorf("wait for the free: %w", serr))
		}
		return true, err
	}
	if err := s.Sync(); err != nil {
		err = fmt.Errorf("initial reserve of %d bytes: wait for the free: %w", n, err)
		// The free is queued but may not have run: wait for the whole
		// device instead (another entry point, which may still work).
		if serr := s.Device().Sync(); serr != nil {
			return false, errors.Join(err, fmt.Errorf("wait for the device: %w", serr))
		}
		return true, err
	}
	return true, nil
}

// discard destroys a pool a constructor made before failing with err,
// unless clean is false (see prime): then the pool is left behind and the
// error says so. A failed destruction is joined to err.
func discard(pool cuda.MemPool, clean bool, err error) error {
	if !clean {
		return errors.Join(err, fmt.Errorf("pool %#x not destroyed (an allocation from it may be outstanding): leaked", pool.Handle()))
	}
	if derr := pool.Destroy(); derr != nil {
		return errors.Join(err, fmt.Errorf("destroy the pool: %w", derr))
	}
	return err
}

// threshold maps an options release threshold to the attribute value: 0
// means keep everything cached.
func threshold(v uint64) uint64 {
	if v == 0 {
		return keepAll
	}
	return v
}
