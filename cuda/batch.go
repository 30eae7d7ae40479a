package cuda

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe" // also for go:linkname

	"github.com/cudamem/cudamem/loader"
)

// MemcpySrcAccessOrder is a CUmemcpySrcAccessOrder: when a batched copy
// may read its source. The destination is always written in stream order.
type MemcpySrcAccessOrder int32

// Source access orders.
const (
	// MemcpySrcAccessOrderInvalid is the zero value; the driver rejects it.
	MemcpySrcAccessOrderInvalid MemcpySrcAccessOrder = 0
	// MemcpySrcAccessOrderStream reads the source in stream order, after
	// the work submitted before the batch: right for any memory a stream
	// may still be writing, so the one package buffer uses.
	MemcpySrcAccessOrderStream MemcpySrcAccessOrder = 1
	// MemcpySrcAccessOrderDuringAPICall lets the driver read the source out
	// of stream order, before the call returns: only for sources no earlier
	// work touches and that may be reused once the call returns.
	MemcpySrcAccessOrderDuringAPICall MemcpySrcAccessOrder = 2
	// MemcpySrcAccessOrderAny lets the driver read the source out of stream
	// order, even after the call returns: only for sources no earlier work
	// touches and that stay untouched until the stream is synchronized.
	MemcpySrcAccessOrderAny MemcpySrcAccessOrder = 3
)

// MemcpyFlags is a CUmemcpyFlags bit set.
type MemcpyFlags uint32

// Batched copy flags.
const (
	MemcpyFlagDefault MemcpyFlags = 0
	// MemcpyFlagPreferOverlapWithCompute asks the driver to overlap the
	// copies with kernels if it can (a hint).
	MemcpyFlagPreferOverlapWithCompute MemcpyFlags = 0x1
)

// MemcpyAttributes is a CUmemcpyAttributes: how the copies of a batch it
// applies to may access their operands. The location hints matter only
// for managed memory and pageable memory a device can access directly;
// the driver ignores them for device and pinned memory.
type MemcpyAttributes struct {
	SrcAccessOrder MemcpySrcAccessOrder
	SrcLocHint     MemLocation
	DstLocHint     MemLocation
	Flags          MemcpyFlags
}

// MemcpyBatchPath is how [Stream.MemcpyBatchAsync] submits a batch on a
// device's driver, chosen from the entry points the driver provides
// (never by falling back on a call's error).
type MemcpyBatchPath int

// Batch paths.
const (
	// MemcpyBatchLoop submits one cuMemcpyAsync per copy: drivers older
	// than CUDA 12.8, which have no batched copy.
	MemcpyBatchLoop MemcpyBatchPath = iota
	// MemcpyBatchV1 is cuMemcpyBatchAsync with the CUDA 12.8 ABI, whose
	// failIdx names the copy that failed (drivers 12.8 and 12.9).
	MemcpyBatchV1
	// MemcpyBatchV2 is cuMemcpyBatchAsync_v2, the CUDA 13.0 ABI.
	MemcpyBatchV2
)

func (p MemcpyBatchPath) String() string {
	return enumName([]string{"loop of cuMemcpyAsync", "cuMemcpyBatchAsync (CUDA 12.8 ABI)", "cuMemcpyBatchAsync_v2 (CUDA 13.0 ABI)"}, int(MemcpyBatchLoop), int(p), "MemcpyBatchPath")
}

// batchPathOf picks the path for driver d from the entry points it
// resolved at load (two flag loads).
func batchPathOf(d *driver) MemcpyBatchPath {
	switch {
	case d.MemcpyBatchAsync.Found():
		return MemcpyBatchV2
	case d.MemcpyBatchAsyncV1.Found():
		return MemcpyBatchV1
	}
	return MemcpyBatchLoop
}

// MemcpyBatchPath reports how [Stream.MemcpyBatchAsync] submits batches
// on d (the loop for a nil or zero Device, which has no driver). Streams
// that are a legacy default stream always use the loop: see
// MemcpyBatchAsync.
func (d *Device) MemcpyBatchPath() MemcpyBatchPath {
	if !d.valid() {
		return MemcpyBatchLoop
	}
	return batchPathOf(d.drv)
}

// BatchCopyError is a batched copy's failure tied to one copy, Index its
// position in the caller's slices. It comes wrapped in an *OpError naming
// the operation (find it with errors.As) and unwraps to the cause.
type BatchCopyError struct {
	Index int   // the copy's position in the batch
	Count int   // copies in the batch
	Err   error // the cause
}

func (e *BatchCopyError) Error() string {
	if e == nil {
		return "<nil>"
	}
	return fmt.Sprintf("copy %d of %d: %v", e.Index, e.Count, e.Err)
}

func (e *BatchCopyError) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Err
}

// legacyStream reports a handle cuMemcpyBatchAsync refuses: the legacy
// default stream, as handle 0 or as CU_STREAM_LEGACY.
func legacyStream(h uintptr) bool { return h == 0 || h == streamLegacy }

// MemcpyBatchAsync copies len(dsts) ranges, ordered on s as a whole:
// sizes[i] bytes from srcs[i] to dsts[i], between any addresses the driver
// knows (the direction is inferred). The copies run in no particular
// order, so none may depend on another.
//
// attrs[k] applies to the copies from attrIdxs[k] up to the next entry's
// index (the last to the end); attrIdxs must start at 0 and increase,
// with no more attributes than copies, each with a valid SrcAccessOrder.
// Both nil mean MemcpySrcAccessOrderStream for every copy.
//
// Everything is checked before anything is submitted: slices of unequal
// length, null addresses, ranges that wrap past 2^64 and bad attributes
// are errors matching ErrInvalidArgument that name the copy or attribute.
// Copies of 0 bytes are skipped; a batch of none is a no-op (the stream
// must still be valid).
//
// The batch is one driver call per 1,024 copies where the driver has a
// batched call (see [Device.MemcpyBatchPath]); otherwise, on the legacy
// default stream and on a capturing stream (neither takes the batched
// call), it is a loop of cuMemcpyAsync that stops at the first failure. A
// failure tied to one copy is a *BatchCopyError naming it. A failed batch
// may have submitted some of its copies.
func (s *Stream) MemcpyBatchAsync(dsts, srcs []DevicePtr, sizes []uint64, attrs []MemcpyAttributes, attrIdxs []uint64) error {
	const op = "Stream.MemcpyBatchAsync"
	n := len(dsts)
	if len(srcs) != n || len(sizes) != n {
		return Errorf(op, ErrInvalidArgument, "dsts, srcs and sizes differ in length (%d, %d and %d)", n, len(srcs), len(sizes))
	}
	if err := checkBatchAttrs(op, attrs, attrIdxs, n); err != nil {
		return err
	}
	nonEmpty := 0
	for i := range n {
		if sizes[i] == 0 {
			continue
		}
		nonEmpty++
		d, s, z := uint64(dsts[i]), uint64(srcs[i]), sizes[i]
		switch {
		case d == 0 || s == 0:
			return BatchErrorf(op, i, n, ErrInvalidArgument, "null address (dst %#x, src %#x, %d bytes)", d, s, z)
		case d+z < d || s+z < s:
			return BatchErrorf(op, i, n, ErrInvalidArgument, "range wraps past 2^64 (dst %#x, src %#x, %d bytes)", d, s, z)
		}
	}
	ctx, h, err := s.begin(op)
	if err != nil {
		return err
	}
	defer s.end()
	if nonEmpty == 0 {
		return nil
	}
	path := batchPathOf(s.dev.drv)
	if legacyStream(h) || batchForceLoop.Load() {
		path = MemcpyBatchLoop
	}
	if path != MemcpyBatchLoop {
		// cuMemcpyBatchAsync cannot be captured (the driver refuses it
		// and loses the capture); the loop's copies become memcpy nodes.
		c, err := s.captureOfLocked(op, ctx, h)
		if err != nil {
			return err
		}
		if c.capturing {
			path = MemcpyBatchLoop
		}
	}
	if path == MemcpyBatchLoop {
		return s.memcpyLoop(ctx, h, dsts, srcs, sizes)
	}
	b := packBatch(dsts, srcs, sizes, attrs, attrIdxs, nonEmpty)
	return s.memcpyBatch(ctx, h, path, &b, n)
}

// memcpyLoop is the batch as one cuMemcpyAsync per non-empty copy, under
// the one stream hold of the caller.
func (s *Stream) memcpyLoop(ctx, h uintptr, dsts, srcs []DevicePtr, sizes []uint64) error {
	p := &s.dev.drv.MemcpyAsync
	for i := range dsts {
		if sizes[i] == 0 {
			continue
		}
		if r := p.CallCtx(ctx, uintptr(dsts[i]), uintptr(srcs[i]), uintptr(sizes[i]), h); !ok(r) {
			return batchFail(p, r, i, len(dsts), fmt.Sprintf("dst %#x, src %#x, %d bytes", uint64(dsts[i]), uint64(srcs[i]), sizes[i]))
		}
	}
	return nil
}

// batch is a batch in the driver's layout: CUdeviceptr and size_t arrays.
// index maps a position in it back to the caller's, when empty copies
// were left out (nil when none was).
type batch struct {
	dsts, srcs []DevicePtr
	sizes      []uintptr
	attrs      []MemcpyAttributes
	attrIdxs   []uintptr
	index      []int
}

// defaultAttrs is the one attribute of a batch given none: stream order.
var defaultAttrs = [1]MemcpyAttributes{{SrcAccessOrder: MemcpySrcAccessOrderStream}}

// packBatch lays the batch out for the driver. On 64-bit targets, where
// size_t is a uint64, a batch without empty copies is passed as given, so
// a large batch costs no copying; otherwise the empty copies are left out
// (the attribute indices shifted to match) and sizes converted.
func packBatch(dsts, srcs []DevicePtr, sizes []uint64, attrs []MemcpyAttributes, attrIdxs []uint64, nonEmpty int) batch {
	if attrs == nil {
		attrs, attrIdxs = defaultAttrs[:], []uint64{0}
	}
	if nonEmpty == len(dsts) && unsafe.Sizeof(uintptr(0)) == 8 {
		return batch{
			dsts: dsts, srcs: srcs,
			sizes:    unsafe.Slice((*uintptr)(unsafe.Pointer(unsafe.SliceData(sizes))), len(sizes)),
			attrs:    attrs,
			attrIdxs: unsafe.Slice((*uintptr)(unsafe.Pointer(unsafe.SliceData(attrIdxs))), len(attrIdxs)),
		}
	}
	b := batch{
		dsts:  make([]DevicePtr, 0, nonEmpty),
		srcs:  make([]DevicePtr, 0, nonEmpty),
		sizes: make([]uintptr, 0, nonEmpty),
		index: make([]int, 0, nonEmpty),
	}
	k, lastK := 0, -1 // the attribute that applies to copy i; the last one kept
	for i := range dsts {
		for k+1 < len(attrIdxs) && uint64(i) >= attrIdxs[k+1] {
			k++
		}
		if sizes[i] == 0 {
			continue
		}
		if k != lastK {
			// The first kept copy under attribute k starts its entry.
			b.attrs = append(b.attrs, attrs[k])
			b.attrIdxs = append(b.attrIdxs, uintptr(len(b.dsts)))
			lastK = k
		}
		b.dsts = append(b.dsts, dsts[i])
		b.srcs = append(b.srcs, srcs[i])
		b.sizes = append(b.sizes, uintptr(sizes[i]))
		b.index = append(b.index, i)
	}
	return b
}

// batchChunk is the most copies one driver call of a batch carries: the
// copy engine starts on the first chunk while the driver takes in the
// next, where one huge call after a host pause ran up to twice as slowly
// per copy (testdata/figures/HISTORY.md).
const batchChunk = 1024

// Test switches of the batched copy (the loop older drivers take, chunk
// sizes). Other packages' tests reach the setters by go:linkname.

var (
	batchForceLoop     atomic.Bool  // while true, every batch takes the loop
	batchChunkOverride atomic.Int64 // while above 0, it replaces batchChunk
)

// forceBatchLoop sends every batch down the loop (on) or not; restore puts
// the previous setting back.
//
//go:linkname forceBatchLoop
//lint:ignore U1000 called through go:linkname by other packages' tests
func forceBatchLoop(on bool) (restore func()) {
	old := batchForceLoop.Swap(on)
	return func() { batchForceLoop.Store(old) }
}

// setBatchChunk makes n the most copies one driver call carries (0: the
// default); restore puts the previous setting back.
//
//go:linkname setBatchChunk
//lint:ignore U1000 called through go:linkname by other packages' tests
func setBatchChunk(n int) (restore func()) {
	old := batchChunkOverride.Swap(int64(n))
	return func() { batchChunkOverride.Store(old) }
}

// memcpyBatch submits b (n copies as the caller counts them, empty ones
// included) through the batched entry point of path, batchChunk copies a
// call, under the caller's stream hold. It stops at the first failure.
func (s *Stream) memcpyBatch(ctx, h uintptr, path MemcpyBatchPath, b *batch, n int) error {
	size := batchChunk
	if c := batchChunkOverride.Load(); c > 0 {
		size = int(min(c, int64(len(b.dsts))))
	}
	return b.chunks(size, func(lo, hi int, attrs []MemcpyAttributes, idxs []uintptr) error {
		return s.memcpyBatchCall(ctx, h, path, b, lo, hi, attrs, idxs, n)
	})
}

// chunks calls f for each run of at most size copies of b, in order, with
// the attributes that apply to the run and their indices relative to its
// first copy (the first 0), until f fails.
func (b *batch) chunks(size int, f func(lo, hi int, attrs []MemcpyAttributes, idxs []uintptr) error) error {
	count := len(b.dsts)
	k := 0            // the attribute run in force at the chunk's first copy
	var idx []uintptr // a later chunk's attribute indices, made relative to it
	for lo := 0; lo < count; lo += size {
		hi := min(lo+size, count)
		for k+1 < len(b.attrIdxs) && b.attrIdxs[k+1] <= uintptr(lo) {
			k++
		}
		j := k + 1 // the first run starting at or after hi
		for j < len(b.attrIdxs) && b.attrIdxs[j] < uintptr(hi) {
			j++
		}
		idxs := b.attrIdxs[k:j]
		if lo > 0 {
			idx = append(idx[:0], 0) // the run in force at lo starts the chunk
			for _, v := range b.attrIdxs[k+1 : j] {
				idx = append(idx, v-uintptr(lo))
			}
			idxs = idx
		}
		if err := f(lo, hi, b.attrs[k:j], idxs); err != nil {
			return err
		}
	}
	return nil
}

// memcpyBatchCall is one driver call: copies lo to hi of b, with the
// chunk's attributes.
func (s *Stream) memcpyBatchCall(ctx, h uintptr, path MemcpyBatchPath, b *batch, lo, hi int, attrs []MemcpyAttributes, idxs []uintptr, n int) error {
	drv := s.dev.drv
	count := uintptr(hi - lo)
	dp := uintptr(unsafe.Pointer(&b.dsts[lo]))
	sp := uintptr(unsafe.Pointer(&b.srcs[lo]))
	zp := uintptr(unsafe.Pointer(&b.sizes[lo]))
	ap := uintptr(unsafe.Pointer(unsafe.SliceData(attrs)))
	ip := uintptr(unsafe.Pointer(unsafe.SliceData(idxs)))
	na := uintptr(len(attrs))
	var r uintptr
	var p *loader.Proc
	failIdx := ^uintptr(0)
	if path == MemcpyBatchV2 {
		p = &drv.MemcpyBatchAsync
		r = p.CallCtx(ctx, dp, sp, zp, count, ap, ip, na, h)
	} else {
		p = &drv.MemcpyBatchAsyncV1
		r = p.CallCtx(ctx, dp, sp, zp, count, ap, ip, na, uintptr(unsafe.Pointer(&failIdx)), h)
	}
	runtime.KeepAlive(b)
	runtime.KeepAlive(attrs)
	runtime.KeepAlive(idxs)
	if ok(r) {
		return nil
	}
	// failIdx (CUDA 12.8 ABI) is the copy the error is about, or SIZE_MAX
	// when it concerns the batch as a whole.
	if failIdx < count {
		f := lo + int(failIdx)
		i := f
		if b.index != nil {
			i = b.index[f]
		}
		return batchFail(p, r, i, n, fmt.Sprintf("named by the driver's failIdx; dst %#x, src %#x, %d bytes", uint64(b.dsts[f]), uint64(b.srcs[f]), b.sizes[f]))
	}
	first, last := lo, hi-1
	if b.index != nil {
		first, last = b.index[first], b.index[last]
	}
	return &OpError{Op: p.Name(), Err: fmt.Errorf("%w (a batch of %d copies, %d of them non-empty, on stream %#x; the driver call for copies %d to %d failed, those before it were submitted)", fail(p, r).(*OpError).Err, n, len(b.dsts), h, first, last)}
}

// BatchErrorf returns an *OpError for op wrapping a *BatchCopyError for
// copy i of n, whose cause wraps base with a formatted explanation (as
// Errorf does).
func BatchErrorf(op string, i, n int, base error, format string, args ...any) error {
	return &OpError{Op: op, Err: &BatchCopyError{Index: i, Count: n, Err: fmt.Errorf("%w: "+format, append([]any{base}, args...)...)}}
}

// batchFail is the error of driver result r from p for copy i of n.
func batchFail(p *loader.Proc, r uintptr, i, n int, detail string) error {
	cause := fail(p, r).(*OpError).Err
	return &OpError{Op: p.Name(), Err: &BatchCopyError{Index: i, Count: n, Err: fmt.Errorf("%w (%s)", cause, detail)}}
}

// checkBatchAttrs checks attrs and attrIdxs against a batch of n copies
// as cuMemcpyBatchAsync would, naming the bad entry.
func checkBatchAttrs(op string, attrs []MemcpyAttributes, attrIdxs []uint64, n int) error {
	if len(attrs) != len(attrIdxs) {
		return Errorf(op, ErrInvalidArgument, "attrs and attrIdxs differ in length (%d and %d)", len(attrs), len(attrIdxs))
	}
	if attrs == nil {
		return nil
	}
	if len(attrs) == 0 {
		return Errorf(op, ErrInvalidArgument, "empty attrs (pass nil for the default: stream order for every copy)")
	}
	if n == 0 {
		return Errorf(op, ErrInvalidArgument, "%d attributes for a batch of no copies", len(attrs))
	}
	if len(attrs) > n {
		return Errorf(op, ErrInvalidArgument, "%d attributes for %d copies (at most one per copy)", len(attrs), n)
	}
	for k, a := range attrs {
		switch {
		case k == 0 && attrIdxs[0] != 0:
			return Errorf(op, ErrInvalidArgument, "attrIdxs[0] is %d: the first attribute must apply from copy 0", attrIdxs[0])
		case k > 0 && attrIdxs[k] <= attrIdxs[k-1]:
			return Errorf(op, ErrInvalidArgument, "attrIdxs[%d] = %d does not follow attrIdxs[%d] = %d (indices must increase)", k, attrIdxs[k], k-1, attrIdxs[k-1])
		case attrIdxs[k] >= uint64(n):
			return Errorf(op, ErrInvalidArgument, "attrIdxs[%d] = %d is past the last copy (%d copies)", k, attrIdxs[k], n)
		case a.SrcAccessOrder < MemcpySrcAccessOrderStream || a.SrcAccessOrder > MemcpySrcAccessOrderAny:
			return Errorf(op, ErrInvalidArgument, "attrs[%d].SrcAccessOrder is %d (want MemcpySrcAccessOrderStream, DuringAPICall or Any)", k, int32(a.SrcAccessOrder))
		case a.Flags&^MemcpyFlagPreferOverlapWithCompute != 0:
			return Errorf(op, ErrInvalidArgument, "attrs[%d].Flags %#x has unknown bits", k, uint32(a.Flags))
		}
	}
	return nil
}
