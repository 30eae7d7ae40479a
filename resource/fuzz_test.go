package resource

import (
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// optionNamed reports whether err names one of the option fields.
func optionNamed(err error, names ...string) bool {
	for _, n := range names {
		if strings.Contains(err.Error(), n) {
			return true
		}
	}
	return false
}

func FuzzDevicePoolOptions(f *testing.F) {
	f.Add(uint64(0), false, uint64(0), uint64(0), true)
	f.Add(uint64(2<<20), false, uint64(0), uint64(4<<20), true)
	f.Add(uint64(0), true, uint64(1<<20), uint64(4<<20), false)
	f.Add(uint64(0), false, uint64(0), uint64(math.MaxUint64), true)
	f.Fuzz(func(t *testing.T, maxSize uint64, ipc bool, threshold, reserve uint64, linux bool) {
		goos := "windows"
		if linux {
			goos = "linux"
		}
		o := DevicePoolOptions{MaxSize: maxSize, IPC: ipc, ReleaseThreshold: threshold, InitialReserve: reserve}
		err := o.check(goos)
		bad := reserve > maxRequest || maxSize > maxRequest || (maxSize != 0 && reserve > maxSize) || (threshold != 0 && reserve > threshold)
		switch {
		case ipc && !linux:
			if !errors.Is(err, cuda.ErrNotSupported) {
				t.Fatalf("IPC on %s: %v", goos, err)
			}
		case bad:
			if !errors.Is(err, cuda.ErrInvalidArgument) || !optionNamed(err, "InitialReserve", "MaxSize") {
				t.Fatalf("%+v accepted or badly reported: %v", o, err)
			}
		case err != nil:
			t.Fatalf("%+v rejected: %v", o, err)
		}
	})
}

func FuzzPinnedPoolOptions(f *testing.F) {
	f.Add(int64(0), false, false, uint64(0), uint64(0), uint64(0))
	f.Add(int64(1)<<32, true, false, uint64(0), uint64(0), uint64(0))
	f.Add(int64(-1), true, true, uint64(0), uint64(0), uint64(0))
	f.Add(int64(3), true, true, uint64(1<<20), uint64(0), uint64(2<<20))
	f.Add(int64(0), false, false, uint64(0), uint64(0), uint64(math.MaxUint64))
	f.Fuzz(func(t *testing.T, node int64, hasNode, ipc bool, maxSize, threshold, reserve uint64) {
		o := PinnedPoolOptions{IPC: ipc, MaxSize: maxSize, ReleaseThreshold: threshold, InitialReserve: reserve}
		n := int(node)
		if hasNode {
			if int64(n) != node {
				t.Skip("node does not fit int on this target")
			}
			o.NUMANode = &n
		}
		err := o.check("linux")
		badNode := hasNode && (node < 0 || node > math.MaxInt32)
		badReserve := reserve > maxRequest || maxSize > maxRequest || (maxSize != 0 && reserve > maxSize) || (threshold != 0 && reserve > threshold)
		switch {
		case badNode:
			if !errors.Is(err, cuda.ErrInvalidArgument) || !optionNamed(err, "NUMANode") {
				t.Fatalf("node %d accepted or badly reported: %v", node, err)
			}
		case badReserve:
			if !errors.Is(err, cuda.ErrInvalidArgument) || !optionNamed(err, "InitialReserve", "MaxSize") {
				t.Fatalf("%+v accepted or badly reported: %v", o, err)
			}
		case err != nil:
			t.Fatalf("%+v rejected: %v", o, err)
		}
	})
}

func FuzzManagedOptions(f *testing.F) {
	f.Add(int32(cuda.MemLocationTypeDevice), int32(0))
	f.Add(int32(cuda.MemLocationTypeHost), int32(0))
	f.Add(int32(cuda.MemLocationTypeHostNUMA), int32(-1))
	f.Add(int32(cuda.MemLocationTypeHostNUMA), int32(7))
	f.Add(int32(99), int32(0))
	f.Fuzz(func(t *testing.T, typ, id int32) {
		loc := cuda.MemLocation{Type: cuda.MemLocationType(typ), ID: id}
		err := checkLocation("NewManaged", "PreferredLocation", loc)
		switch loc.Type {
		case cuda.MemLocationTypeHost, cuda.MemLocationTypeHostNUMACurrent:
			if err != nil {
				t.Fatalf("%s rejected: %v", loc.String(), err)
			}
		case cuda.MemLocationTypeHostNUMA:
			if (id < 0) != (err != nil) {
				t.Fatalf("%s: %v", loc.String(), err)
			}
		case cuda.MemLocationTypeDevice:
			// Needs the driver to say whether the device exists; without
			// one it must fail cleanly, with one it may pass.
		default:
			if !errors.Is(err, cuda.ErrInvalidArgument) || !optionNamed(err, "PreferredLocation") {
				t.Fatalf("%s accepted or badly reported: %v", loc.String(), err)
			}
		}
		if err != nil && !strings.HasPrefix(err.Error(), "NewManaged") {
			t.Fatalf("error does not name the operation: %v", err)
		}
	})
}

func FuzzSubAllocatorOptions(f *testing.F) {
	f.Add(uint64(0), uint64(0), uint64(0), uint64(0))
	f.Add(uint64(1<<20), uint64(1<<20), uint64(4<<20), uint64(4096))
	f.Add(uint64(math.MaxUint64), uint64(0), uint64(0), uint64(0))
	f.Add(uint64(0), uint64(math.MaxUint64), uint64(0), uint64(0))
	f.Add(uint64(0), uint64(0), uint64(0), uint64(3))
	f.Add(uint64(8<<20), uint64(0), uint64(4<<20), uint64(0))
	f.Add(uint64(0), uint64(0), uint64(0), uint64(1)<<63)
	f.Fuzz(func(t *testing.T, initial, grow, maxSize, align uint64) {
		up := newSAUpstream()
		up.limit = 1 << 40 // the fake has no real memory; keep it bounded
		o := &SubAllocatorOptions{InitialSize: initial, GrowSize: grow, MaxSize: maxSize, Alignment: align}
		a, err := NewSubAllocator(up, o)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "NewSubAllocator") {
				t.Fatalf("error does not name the operation: %v", err)
			}
			if errors.Is(err, cuda.ErrInvalidArgument) && !optionNamed(err, "InitialSize", "GrowSize", "MaxSize", "Alignment") {
				t.Fatalf("error names no option: %v", err)
			}
			if _, _, live := up.counts(); live != 0 {
				t.Fatalf("failed constructor left %d upstream allocations", live)
			}
			return
		}
		if align != 0 && align&(align-1) != 0 {
			t.Fatalf("alignment %d accepted", align)
		}
		if maxSize != 0 && a.Stats().Reserved > maxSize {
			t.Fatalf("reserved %d over MaxSize %d", a.Stats().Reserved, maxSize)
		}
		a.order = &saOrder{}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if _, _, live := up.counts(); live != 0 {
			t.Fatalf("Close left %d upstream allocations", live)
		}
	})
}

// FuzzSubAllocatorOps decodes the input into a sequence of operations on a
// sub-allocator over the fake upstream and checks the invariants after
// every step: live allocations disjoint, aligned and inside upstream
// blocks; the reserve within MaxSize; the books consistent (saCheck); and
// nothing left at the upstream after everything is freed and closed.
//
// Input: 2 bytes of options (alignment exponent, MaxSize in 64 KiB units,
// 0 for none), then 4-byte steps: an opcode byte, a stream byte, and a
// 16-bit argument.
func FuzzSubAllocatorOps(f *testing.F) {
	f.Add([]byte{8, 0, 0, 0, 0x10, 0, 1, 0, 0, 0})
	f.Add([]byte{12, 4, 0, 1, 0xff, 0xff, 0, 2, 0x00, 0x10, 1, 0, 0, 0, 2, 0, 0, 0})
	f.Add([]byte{9, 2, 0, 0, 0, 1, 0, 1, 0, 2, 0, 2, 0, 3, 1, 0, 0, 0, 1, 0, 1, 0, 2, 0, 0, 0, 3, 0, 0, 0})
	f.Add([]byte{0, 1, 0, 0, 0xff, 0xff, 0, 1, 0xff, 0xff, 4, 0, 0, 0, 1, 0, 0, 0, 4, 0, 0, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		align := uint64(1) << (8 + data[0]%5) // 256 .. 4096
		maxSize := uint64(data[1]) << 16
		up := newSAUpstream()
		a, err := NewSubAllocator(up, &SubAllocatorOptions{Alignment: align, MaxSize: maxSize, GrowSize: 128 << 10})
		if err != nil {
			t.Fatal(err)
		}
		a.order = &saOrder{}
		streams := []*cuda.Stream{nil, {}, {}, {}}
		var live []*buffer.Buffer
		closed := false
		for p := data[2:]; len(p) >= 4; p = p[4:] {
			op, s, arg := p[0]%5, streams[p[1]%4], binary.LittleEndian.Uint16(p[2:])
			switch op {
			case 0: // allocate arg*16 bytes (0 .. ~1 MiB)
				b, err := a.Allocate(uint64(arg)*16, s)
				switch {
				case err == nil:
					if b.Ptr() != 0 {
						live = append(live, b)
					}
				case closed && errors.Is(err, cuda.ErrClosed):
				case errors.Is(err, cuda.ErrorOutOfMemory) && maxSize != 0:
				default:
					t.Fatalf("Allocate(%d): %v", uint64(arg)*16, err)
				}
			case 1: // free live[arg] on its stream, or on another
				if len(live) == 0 {
					continue
				}
				i := int(arg) % len(live)
				var err error
				if p[1]&4 != 0 {
					err = live[i].CloseOn(s)
				} else {
					err = live[i].Close()
				}
				if err != nil {
					t.Fatalf("free: %v", err)
				}
				live = append(live[:i], live[i+1:]...)
			case 2:
				if err := a.Trim(); err != nil && !(closed && errors.Is(err, cuda.ErrClosed)) {
					t.Fatalf("Trim: %v", err)
				}
			case 3:
				err := a.Close()
				if err != nil && !(len(live) > 0 && errors.Is(err, cuda.ErrorIllegalState)) {
					t.Fatalf("Close: %v", err)
				}
				closed = true
			case 4: // a free the sub-allocator never made: refused, nothing changes
				err := a.Deallocate(cuda.DevicePtr(uint64(arg)*256+1), 256, s)
				if !errors.Is(err, cuda.ErrInvalidArgument) {
					t.Fatalf("bogus free: %v", err)
				}
			}
			saCheck(t, a)
			checkLive(t, a, up, live, align, maxSize)
		}
		for _, b := range live {
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if !closed {
			if err := a.Trim(); err != nil {
				t.Fatal(err)
			}
		}
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if _, _, n := up.counts(); n != 0 {
			t.Fatalf("%d upstream allocations leaked", n)
		}
	})
}

// checkLive checks the live buffers against each other and the upstream.
func checkLive(t *testing.T, a *SubAllocator, up *saUpstream, live []*buffer.Buffer, align, maxSize uint64) {
	t.Helper()
	up.mu.Lock()
	defer up.mu.Unlock()
	type rng struct{ lo, hi uint64 }
	var rs []rng
	for _, b := range live {
		p, n := uint64(b.Ptr()), b.Size()
		if p%align != 0 {
			t.Fatalf("%#x not aligned to %d", p, align)
		}
		inside := false
		for bp, bn := range up.live {
			if p >= uint64(bp) && p+n <= uint64(bp)+bn {
				inside = true
				break
			}
		}
		if !inside {
			t.Fatalf("%#x (+%d) outside every upstream block", p, n)
		}
		for _, r := range rs {
			if p < r.hi && r.lo < p+n {
				t.Fatalf("%#x (+%d) overlaps [%#x, %#x)", p, n, r.lo, r.hi)
			}
		}
		rs = append(rs, rng{p, p + n})
	}
	if maxSize != 0 && up.held > maxSize {
		t.Fatalf("upstream holds %d bytes, over MaxSize %d", up.held, maxSize)
	}
	if got := uint64(0); true {
		for _, n := range up.live {
			got += n
		}
		if st := a.held; st != got {
			t.Fatalf("sub-allocator books %d bytes held, upstream %d", st, got)
		}
	}
}
