//go:build linux

package probe

import (
	"math"
	"os"
	"testing"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
)

func TestCudaHostile(t *testing.T) {
	t.Cleanup(baseline(t))
	d0, d1 := dev(t, 0), dev(t, 1)
	s, _ := d0.NewStream()
	s.Close()
	s1, _ := d1.NewStream()
	defer s1.Close()
	e, _ := d0.NewEvent(0)
	e.Close()
	var buf [16]byte
	hp := unsafe.Pointer(&buf[0])
	p, err := d0.MemAlloc(64)
	if err != nil {
		t.Fatal(err)
	}
	defer d0.MemFree(p)
	before := len(testutil.FDs(t))
	cases := map[string]func() error{
		"MemAlloc(1<<63)":      func() error { q, err := d0.MemAlloc(1 << 63); _ = q; return err },
		"MemAlloc(max)":        func() error { _, err := d0.MemAlloc(math.MaxUint64); return err },
		"MemAllocManaged(max)": func() error { _, err := d0.MemAllocManaged(math.MaxUint64, 1); return err },
		"MemAllocManaged(flags)": func() error {
			q, err := d0.MemAllocManaged(64, 77)
			if err == nil {
				d0.MemFree(q)
			}
			return err
		},
		"MemHostAlloc(max)":       func() error { _, err := d0.MemHostAlloc(math.MaxUint64, 0); return err },
		"MemHostRegister(nil)":    func() error { return d0.MemHostRegister(nil, 16, 0) },
		"MemHostRegister(huge)":   func() error { return d0.MemHostRegister(hp, math.MaxUint64, 0) },
		"MemHostUnregister(nil)":  func() error { return d0.MemHostUnregister(nil) },
		"MemFreeHost(nil)":        func() error { return d0.MemFreeHost(nil) },
		"MemFree(garbage)":        func() error { return d0.MemFree(0xdeadbeef000) },
		"MemcpyHtoD(nil src)":     func() error { return d0.MemcpyHtoD(p, nil, 16) },
		"MemcpyHtoD(overflow)":    func() error { return d0.MemcpyHtoD(math.MaxUint64-4, hp, 16) },
		"MemcpyDtoH(nil dst)":     func() error { return d0.MemcpyDtoH(nil, p, 16) },
		"MemcpyAsync(closed)":     func() error { return s.MemcpyAsync(p, p+32, 16) },
		"MemcpyAsync(overflow)":   func() error { return d0.DefaultStream().MemcpyAsync(p, math.MaxUint64-3, 16) },
		"MemsetD32(overflow n)":   func() error { return d0.DefaultStream().MemsetD32Async(p, 1, math.MaxUint64/2) },
		"MemsetD16(overflow n)":   func() error { return d0.DefaultStream().MemsetD16Async(p, 1, 1<<63) },
		"PeerAsync(nil dev)":      func() error { return d0.DefaultStream().MemcpyPeerAsync(p, nil, p, d0, 16) },
		"PeerAsync(zero dev)":     func() error { return d0.DefaultStream().MemcpyPeerAsync(p, new(cuda.Device), p, d0, 16) },
		"WaitStream(closed)":      func() error { return d0.DefaultStream().WaitStream(s) },
		"WaitStream(nil)":         func() error { return d0.DefaultStream().WaitStream(nil) },
		"WaitStream(zero)":        func() error { return d0.DefaultStream().WaitStream(new(cuda.Stream)) },
		"WaitStream(closed recv)": func() error { return s.WaitStream(s1) },
		"WaitEvent(closed)":       func() error { return s1.WaitEvent(e) },
		"WaitEvent(nil)":          func() error { return s1.WaitEvent(nil) },
		"Record(closed stream)":   func() error { e2, _ := d0.NewEvent(0); defer e2.Close(); return e2.Record(s) },
		"Record(closed event)":    func() error { return e.Record(s1) },
		"Elapsed(nil)":            func() error { _, err := cuda.Elapsed(nil, nil); return err },
		"Elapsed(closed)":         func() error { _, err := cuda.Elapsed(e, e); return err },
		"ImportMemPoolFD(-1)":     func() error { _, err := d0.ImportMemPoolFD(-1); return err },
		"ImportMemPoolFD(stdin)":  func() error { _, err := d0.ImportMemPoolFD(0); return err },
		"MemImportFD(-1)":         func() error { _, err := d0.MemImportFD(-1); return err },
		"MemImportFD(devnull)": func() error {
			f, _ := os.Open("/dev/null")
			defer f.Close()
			_, err := d0.MemImportFD(int(f.Fd()))
			return err
		},
		"IPCOpenMemHandle(zero)":   func() error { _, err := d0.IPCOpenMemHandle(cuda.IPCMemHandle{}, 0); return err },
		"IPCOpenMemHandle(flags)":  func() error { _, err := d0.IPCOpenMemHandle(cuda.IPCMemHandle{}, 99); return err },
		"IPCCloseMemHandle(p)":     func() error { return d0.IPCCloseMemHandle(p) },
		"MemAddressReserve(max)":   func() error { _, err := d0.MemAddressReserve(math.MaxUint64, 0, 0); return err },
		"MemAddressReserve(align)": func() error { _, err := d0.MemAddressReserve(1<<21, 3, 0); return err },
		"MemAddressFree(garbage)":  func() error { return d0.MemAddressFree(0x1000, 1<<21) },
		"MemMap(zero handle)":      func() error { return d0.MemMap(0x1000, 1<<21, 0, cuda.MemHandle(0)) },
		"MemRelease(garbage)":      func() error { return d0.MemRelease(cuda.MemHandle(12345)) },
		"MemUnmap(overflow)":       func() error { return d0.MemUnmap(math.MaxUint64-10, 1<<21) },
		"MemSetAccess(none)":       func() error { return d0.MemSetAccess(p, 64) },
		"MemAdvise(overflow)":      func() error { return d0.MemAdvise(math.MaxUint64-3, 16, 1, cuda.MemLocation{}) },
		"Prefetch(overflow)":       func() error { return d0.DefaultStream().MemPrefetchAsync(math.MaxUint64-3, 16, cuda.MemLocation{}) },
		"CreateMemPool(nil)":       func() error { _, err := d0.CreateMemPool(nil); return err },
		"CreateMemPool(zero)": func() error {
			pl, err := d0.CreateMemPool(&cuda.MemPoolProps{})
			if err == nil {
				pl.Destroy()
			}
			return err
		},
		"SetMemPool(zero)":       func() error { return d0.SetMemPool(cuda.MemPool{}) },
		"ZeroPool.Destroy":       func() error { return cuda.MemPool{}.Destroy() },
		"ZeroPool.ExportFD":      func() error { _, err := cuda.MemPool{}.ExportFD(); return err },
		"ZeroPool.ImportPointer": func() error { _, err := cuda.MemPool{}.ImportPointer(nil); return err },
		"AllocFromPool(zero)":    func() error { _, err := s1.MemAllocFromPoolAsync(cuda.MemPool{}, 64); return err },
		"MemAllocAsync(max)":     func() error { _, err := s1.MemAllocAsync(math.MaxUint64); return err },
		"MemFreeAsync(garbage)":  func() error { return s1.MemFreeAsync(0x1234) },
		"EnablePeerAccess(self)": func() error { return d0.EnablePeerAccess(d0) },
		"EnablePeerAccess(nil)":  func() error { return d0.EnablePeerAccess(nil) },
		"CanAccessPeer(zero)":    func() error { _, err := d0.CanAccessPeer(new(cuda.Device)); return err },
		"GetDevice(-1)":          func() error { _, err := cuda.GetDevice(-1); return err },
		"GetDevice(2)":           func() error { _, err := cuda.GetDevice(2); return err },
		"GetDevice(maxint)":      func() error { _, err := cuda.GetDevice(math.MaxInt); return err },
		"NewStreamWith(prio)": func() error {
			st, err := d0.NewStreamWith(99, math.MaxInt)
			if err == nil {
				st.Close()
			}
			return err
		},
		"LoadModule(nil)":            func() error { _, err := d0.LoadModule(nil); return err },
		"Attribute(-1)":              func() error { _, err := d0.Attribute(-1); return err },
		"DefaultHostMemPool(bad)":    func() error { _, err := d0.DefaultHostMemPool(cuda.MemLocation{Type: 99}); return err },
		"AllocationGranularity(nil)": func() error { _, err := d0.AllocationGranularity(nil, 0); return err },
		"MemCreate(nil)":             func() error { _, err := d0.MemCreate(1<<21, nil); return err },
		"QueryPointer(0)":            func() error { _, err := cuda.QueryPointer(0); return err },
	}
	for name, f := range cases {
		noPanic(t, name, func() {
			err := f()
			if err == nil {
				t.Logf("%s: accepted", name)
				return
			}
			wantErr(t, name, err, "")
			t.Logf("%s: %v", name, err)
		})
	}
	if got := len(testutil.FDs(t)); got != before {
		t.Errorf("fds %d, before %d", got, before)
	}
}
