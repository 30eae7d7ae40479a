//go:build cudamemfault && linux

package faultsweep

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/faultinject"
	"github.com/cudamem/cudamem/ipc"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/virtual"
)

// The driver call sequences of the operations cudamem bench times against
// the C baseline (testdata/cgobench), recorded call by call through the
// loader's trace (cudamemfault builds) and asserted against the C code's
// calls. Anything beyond C's calls must be listed here with its reason:
// these are the operations whose GPU ratios were off (ipc/pool_create_export
// 4.8x, ipc/child_import 1.5x, vmm/allocfree/1GiB 1.9x).
//
// Not visible in a trace: every context-taking call goes through the
// loader's trampoline, which calls cuCtxSetCurrent with the device's
// primary context first (a thread-local store in the driver; C sets it
// once per thread). That is a constant of tens of nanoseconds per call.

// trace runs op with the loader's call trace on and returns the calls.
func trace(t *testing.T, op func() error) []string {
	t.Helper()
	_, _, err := cuda.Driver() // load and resolve the driver before counting calls
	if err != nil {
		t.Fatal(err)
	}
	faultinject.TraceStart()
	err = op()
	calls := faultinject.TraceStop()
	if err != nil {
		t.Fatalf("%v (calls %v)", err, calls)
	}
	return calls
}

// otherDevices is how many devices besides device 0 there are: an owned
// pool's Close asks the driver once for each whether it has access
// (cuMemPoolGetAccess), to revoke it before the pool is destroyed
// (cuda.core #2807). The bench machine has one device, so none there.
func otherDevices(t *testing.T) int {
	ds, err := cuda.Devices()
	if err != nil {
		t.Fatal(err)
	}
	return len(ds) - 1
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// traceStream makes a stream for a call-sequence test, closed with what
// the test adds to cl when the test ends.
func traceStream(t *testing.T, cl *closers) *cuda.Stream {
	t.Helper()
	s, err := newStream(cl, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cl.run(); err != nil {
			t.Error(err)
		}
	})
	return s
}

func requireCalls(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Fatalf("%s made %d driver calls:\n  %s\nwant %d:\n  %s", what, len(got), strings.Join(got, "\n  "), len(want), strings.Join(want, "\n  "))
	}
}

// TestCallSequencePoolCreateExport: cmd/cudamem's ipc/pool_create_export
// iteration (NewDevicePool with IPC, ExportPool, Allocate, ExportBuffer,
// and the three Closes) against cb_ipc_pool_create_export.
func TestCallSequencePoolCreateExport(t *testing.T) {
	cl := &closers{}
	s := traceStream(t, cl)
	iteration := func() (err error) {
		p, err := resource.NewDevicePool(dev0(), &resource.DevicePoolOptions{IPC: true})
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, p.Close()) }()
		h, err := ipc.ExportPool(p)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, h.Close()) }()
		b, err := p.Allocate(1<<20, s)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, b.Close()) }()
		_, err = ipc.ExportBuffer(b)
		return err
	}
	// C, in order (close(fd) between the free and the sync is no driver
	// call).
	c := []string{
		"cuMemPoolCreate",
		"cuMemPoolSetAttribute", // release threshold
		"cuMemPoolExportToShareableHandle",
		"cuMemAllocFromPoolAsync",
		"cuStreamSynchronize", // ExportBuffer waits for the allocation
		"cuMemPoolExportPointer",
		"cuMemFreeAsync",
		"cuCtxSynchronize", // the frees complete before the pool goes
		"cuMemPoolDestroy",
	}
	// Ours: C's calls, plus one cuMemPoolGetAccess per other device in
	// Close, after the wait and before the destruction (peer revocation;
	// none on a one-GPU machine). NewDevicePool's feature check
	// (Device.Features: ten cuDeviceGetAttribute) reaches the driver once
	// per process, not per pool: the first iteration here is a warm-up,
	// as the bench's is, unless an earlier test already made it.
	want := slices.Concat(c[:8], repeat("cuMemPoolGetAccess", otherDevices(t)), c[8:])
	if err := iteration(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		got := trace(t, iteration)
		requireCalls(t, fmt.Sprintf("pool_create_export iteration %d", i+2), got, want)
	}
}

// TestCallSequenceChildImport: what cmd/cudamem's ipc/child_import child
// times (NewHandle, ImportPool, Import), in-process on the fake,
// against cb_ipc_child's cuMemPoolImportFromShareableHandle +
// cuMemPoolImportPointer; and its untimed teardown.
func TestCallSequenceChildImport(t *testing.T) {
	f, err := newIPC(true, false)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := f.cl.run(); err != nil {
			t.Error(err)
		}
	}()
	fd, err := f.h.FD()
	if err != nil {
		t.Fatal(err)
	}
	child, err := syscall.Dup(fd) // as the child's fd 3
	if err != nil {
		t.Fatal(err)
	}
	raw, err := f.desc.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var h *ipc.Handle
	var p *ipc.ImportedPool
	var b *buffer.Buffer
	got := trace(t, func() error {
		var err error
		if h, err = ipc.NewHandle(child, f.h.Token()); err != nil {
			syscall.Close(child)
			return err
		}
		var d ipc.Descriptor
		if err := d.UnmarshalBinary(raw); err != nil {
			return err
		}
		if p, err = ipc.ImportPool(dev0(), h); err != nil {
			return err
		}
		b, err = p.Import(d, nil)
		return err
	})
	requireCalls(t, "child import (timed part)", got, []string{
		"cuMemPoolImportFromShareableHandle",
		"cuMemPoolImportPointer",
		// The bounds check: a descriptor may not claim more than the
		// mapping the driver made (ipc/doc.go). C trusts the size.
		"cuMemGetAddressRange",
	})
	got = trace(t, func() error { return errors.Join(b.Close(), p.Close(), h.Close()) })
	// C frees with cuMemFree_v2 (synchronous) and destroys; ours frees in
	// stream order and waits for the device before destroying (the pool
	// must not go under a pending free; see resource/pool.go).
	requireCalls(t, "child teardown (untimed)", got, []string{"cuMemFreeAsync", "cuCtxSynchronize", "cuMemPoolDestroy"})
}

// TestCallSequenceVMMAllocFree: cmd/cudamem's vmm/allocfree iteration
// (virtual.Resource with POSIX-fd handles, Allocate + Close on a stream)
// against cb_vmm_allocfree, at the sizes the bench uses. The call list is
// the same at every size: one chunk, one mapping, one access call.
func TestCallSequenceVMMAllocFree(t *testing.T) {
	cl := &closers{}
	s := traceStream(t, cl)
	r, err := virtual.New(dev0(), &virtual.Options{HandleType: virtual.HandlePosixFD})
	if err != nil {
		t.Fatal(err)
	}
	c := []string{
		"cuMemAddressReserve", // aligned to the granularity, as C
		"cuMemCreate",
		"cuMemMap",
		"cuMemSetAccess",
		"cuStreamSynchronize", // Close waits for the buffer's stream
		"cuMemUnmap",
		"cuMemRelease",
		"cuMemAddressFree",
	}
	for _, size := range []uint64{2 << 20, 64 << 20, 1 << 30} {
		got := trace(t, func() error {
			b, err := r.Allocate(size, s)
			if err != nil {
				return err
			}
			return b.Close()
		})
		requireCalls(t, "vmm allocfree", got, c)
	}
}

// TestCallSequencePoolPairs: cmd/cudamem's poolpair/resource and
// poolpair/pinned iterations (Allocate + Close through a DevicePool and a
// PinnedPool) against cb_poolpair_on: the two stream-ordered calls and
// nothing else, so what the resource path adds to the pair on a GPU host
// is Go work, not driver calls.
func TestCallSequencePoolPairs(t *testing.T) {
	cl := &closers{}
	s := traceStream(t, cl)
	dp, err := resource.CurrentDevicePool(dev0())
	if err != nil {
		t.Fatal(err)
	}
	pp, err := resource.NewPinnedPool(nil)
	if err != nil {
		t.Fatal(err)
	}
	cl.add(pp.Close)
	want := []string{"cuMemAllocFromPoolAsync", "cuMemFreeAsync"}
	for _, mr := range []buffer.MemoryResource{dp, pp} {
		for _, size := range []uint64{256, 1 << 20, 64 << 20} {
			allocate := func() error {
				b, err := buffer.Allocate(mr, size, s)
				if err != nil {
					return err
				}
				return b.Close()
			}
			if err := allocate(); err != nil { // the first pair of a pool may ask more
				t.Fatal(err)
			}
			requireCalls(t, fmt.Sprintf("%T pair of %d bytes", mr, size), trace(t, allocate), want)
		}
	}
}
