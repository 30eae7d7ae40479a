package virtual

import (
	"errors"
	"strings"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

var optionNames = []string{"AllocationType", "Location", "NUMANode", "HandleType", "Granularity",
	"GPUDirectRDMA", "AddrHint", "AddrAlign", "Reserve", "Peers", "SelfAccess", "PeerAccess"}

// fuzzPeers turns bytes into a peer list: 0 nil, 1 the resource's own
// device, 2 and 3 two other devices.
func fuzzPeers(b []byte) []*cuda.Device {
	var out []*cuda.Device
	for _, c := range b {
		out = append(out, []*cuda.Device{nil, fakeDevice, fakePeer1, fakePeer2}[c%4])
	}
	return out
}

// FuzzOptions: New never panics; what it rejects is an ErrInvalidArgument
// naming the option (or ErrNotSupported); what it accepts is valid: the
// driver gets well-formed properties, and an allocation can be made,
// grown and freed without leaving anything behind.
func FuzzOptions(f *testing.F) {
	f.Add(0, 0, 0, 0, 0, false, uint64(0), uint64(0), uint64(0), []byte{}, 0, 0, uint64(2<<20))
	f.Add(1, 2, 1, 1, 1, true, uint64(0), uint64(1<<30), uint64(1<<30), []byte{2, 3}, 1, 2, uint64(2<<20))
	f.Add(0, 0, 0, 2, 0, false, uint64(0x7f0040000000), uint64(0), uint64(3<<20), []byte{2}, 0, 1, uint64(64<<10))
	f.Add(7, 9, -1, 99, 5, false, uint64(0x1000), uint64(3), uint64(1<<63), []byte{0, 1, 2, 2}, 9, -1, uint64(3<<20))
	f.Add(0, 2, int(bigNUMA), 0, 0, false, uint64(0), uint64(0), uint64(0), []byte{}, 0, 0, uint64(0))
	f.Fuzz(func(t *testing.T, allocType, loc, numa, handle, gran int, rdma bool, hint, align, reserve uint64,
		peers []byte, self, peerAcc int, drvGran uint64) {
		o := Options{
			AllocationType: AllocationType(allocType), Location: LocationType(loc), NUMANode: numa,
			HandleType: HandleType(handle), Granularity: Granularity(gran), GPUDirectRDMA: rdma,
			AddrHint: cuda.DevicePtr(hint), AddrAlign: align, Reserve: reserve, Peers: fuzzPeers(peers),
			SelfAccess: Access(self), PeerAccess: Access(peerAcc),
		}
		fd := newFake(drvGran)
		r, err := newResource(fd, fakeDevice, &o)
		if err != nil {
			switch {
			case errors.Is(err, cuda.ErrNotSupported):
			case errors.Is(err, cuda.ErrInvalidArgument):
				named := false
				for _, n := range optionNames {
					named = named || strings.Contains(err.Error(), "option "+n+": ")
				}
				if !named {
					t.Fatalf("rejection names no option: %v", err)
				}
			default:
				t.Fatalf("rejected with an unexpected error: %v", err)
			}
			return
		}
		// Accepted: everything the driver will see is well formed.
		p := r.prop
		if p.Type != cuda.MemAllocationTypePinned && p.Type != cuda.MemAllocationTypeManaged {
			t.Fatalf("accepted allocation type %d", p.Type)
		}
		switch p.Location.Type {
		case cuda.MemLocationTypeDevice, cuda.MemLocationTypeHost, cuda.MemLocationTypeHostNUMACurrent:
		case cuda.MemLocationTypeHostNUMA:
			if int(p.Location.ID) != numa || numa < 0 {
				t.Fatalf("NUMA node %d became %d", numa, p.Location.ID)
			}
		default:
			t.Fatalf("accepted location type %d", p.Location.Type)
		}
		if r.gran == 0 || r.gran&(r.gran-1) != 0 || r.align < r.gran || r.align&(r.align-1) != 0 {
			t.Fatalf("granularity %d, alignment %d", r.gran, r.align)
		}
		if r.reserve < reserve || r.reserve%r.gran != 0 || uint64(o.AddrHint)%r.align != 0 {
			t.Fatalf("reserve %d for %d, hint %#x for alignment %d", r.reserve, reserve, hint, r.align)
		}
		seen := map[cuda.MemLocation]bool{}
		for _, d := range r.descs {
			if seen[d.Location] {
				t.Fatalf("two access entries for %v: %v", d.Location, r.descs)
			}
			seen[d.Location] = true
			if d.Flags != cuda.MemAccessProtNone && d.Flags != cuda.MemAccessProtRead && d.Flags != cuda.MemAccessProtReadWrite {
				t.Fatalf("access flags %d", d.Flags)
			}
		}
		b, err := r.Allocate(1, nil)
		if errors.Is(err, cuda.ErrorOutOfMemory) {
			return // a reservation larger than the address space: the driver's call
		}
		if err != nil {
			t.Fatalf("accepted options %+v cannot allocate: %v", o, err)
		}
		if b, err = r.Grow(b, r.gran+1); err != nil && !errors.Is(err, cuda.ErrorOutOfMemory) {
			t.Fatalf("accepted options %+v cannot grow: %v", o, err)
		}
		checkInvariants(t, r, fd)
		if b != nil {
			mustOK(t, b.Close())
		}
		fd.requireEmpty(t)
	})
}

// FuzzGrowShrink runs sequences of allocations, grows (in place, adjacent
// and moving), shrinks, access changes and closes over the fake driver,
// with one driver call (or every call from one on) failing. After every
// step the mapped chunks cover exactly each allocation's size and the
// driver holds nothing unaccounted for; at the end, with the driver
// healed, closing everything leaves nothing behind.
func FuzzGrowShrink(f *testing.F) {
	f.Add([]byte{0, 1, 2, 1, 4}, uint16(0), false, false)
	f.Add([]byte{0, 0x29, 0x0d, 0x12, 0x31, 0x03, 0x0b, 0x04}, uint16(5), false, true)
	f.Add([]byte{8, 0x15, 0x0a, 0x0e, 0x22, 0x1c, 0x04, 0x0c}, uint16(7), true, false)
	f.Add([]byte{0, 0x21, 0x05, 0x09, 0x1a, 0x2a, 0x02, 0x0c, 0x04}, uint16(11), false, false)
	// Close with the release failing after the unmap (ErrPartlyFreed).
	f.Add([]byte{0x08, 0x04}, uint16(7), false, false)
	// Grow past a blocked range with the stray reservation's free failing.
	f.Add([]byte{0x00, 0x05, 0x19}, uint16(6), false, false)
	// Shrink with the release of the dropped chunk failing.
	f.Add([]byte{0x08, 0x19, 0x42}, uint16(11), false, false)
	f.Fuzz(func(t *testing.T, ops []byte, fail uint16, sticky, reserve bool) {
		const g = 1 << 16
		o := &Options{HandleType: HandleNone, Peers: []*cuda.Device{fakePeer1}}
		if reserve {
			o.Reserve = 6 * g
		}
		r, fd := newFakeResource(t, g, o)
		if fail != 0 {
			fd.failAt(int(fail), sticky)
		}
		var bufs []*buffer.Buffer
		pick := func(c byte) int { return int(c>>3) % len(bufs) }
		for _, c := range ops {
			arg := uint64(c>>3)%8 + 1
			// A driver failure must surface, unless it was the adjacent
			// reservation Grow tries first (moving is its fallback), or
			// it hit the retry of an earlier failure's leftovers (best
			// effort by design, reported by Reclaim).
			failedBefore, clean := fd.failed, !leftoversKept(r)
			var opErr error
			grow := false
			switch c % 8 {
			case 0, 6:
				if len(bufs) < 4 {
					b, err := r.Allocate(arg*g/2, nil)
					if opErr = err; err == nil {
						bufs = append(bufs, b)
					}
				}
			case 1, 7:
				if len(bufs) > 0 {
					i := pick(c)
					old := bufs[i]
					nb, err := r.Grow(old, old.Size()+arg*g/3)
					checkResize(t, "Grow", old, nb, err)
					opErr, grow = err, true
					if nb != nil {
						bufs[i] = nb
					}
				}
			case 2:
				if len(bufs) > 0 {
					i := pick(c)
					old := bufs[i]
					nb, err := r.Shrink(old, max(1, old.Size()*uint64(c>>6)/4))
					checkResize(t, "Shrink", old, nb, err)
					opErr = err
					if nb != nil {
						bufs[i] = nb
					}
				}
			case 3:
				if len(bufs) > 0 {
					acc := Access(c>>5) % 3
					err := r.SetPeerAccess(bufs[pick(c)], acc, fakePeer2)
					opErr = err
					if err != nil && !errors.Is(err, cuda.ErrorUnknown) && !errors.Is(err, cuda.ErrClosed) {
						t.Fatalf("SetPeerAccess: %v", err)
					}
				}
			case 4:
				if len(bufs) > 0 {
					i := pick(c)
					err := bufs[i].Close()
					opErr = err
					// Close either frees (nil, or an error wrapping
					// ErrPartlyFreed: memory gone, buffer closed) or leaves
					// the buffer open and intact.
					if gone := err == nil || errors.Is(err, buffer.ErrPartlyFreed); gone != bufs[i].IsClosed() {
						t.Fatalf("Close: error %v, closed %v", err, bufs[i].IsClosed())
					}
					if bufs[i].IsClosed() {
						bufs = append(bufs[:i], bufs[i+1:]...)
					}
				}
			case 5:
				if len(bufs) > 0 {
					// Take the address space after an allocation, so the
					// next grow of it must move.
					b := bufs[pick(c)]
					info, err := r.Info(b)
					if err == nil {
						at := b.Ptr() + cuda.DevicePtr(info.Reserved)
						if fd.inReservation(at, 1) {
							break
						}
						fd.block(at, g)
					}
				}
			}
			if opErr == nil && clean && fd.failed > failedBefore && !(grow && fd.lastFailed == "cuMemAddressReserve") {
				t.Fatalf("op %#x: the failure of %s was swallowed", c, fd.lastFailed)
			}
			checkInvariants(t, r, fd)
			// Every buffer still held is open, and an open buffer is
			// always over a whole, usable allocation (never over memory a
			// failed Close or resize already unmapped).
			for _, b := range bufs {
				info, err := r.Info(b)
				if err != nil {
					t.Fatalf("open buffer %v: %v", b, err)
				}
				if info.Size != b.Size() {
					t.Fatalf("buffer of %d bytes over an allocation of %d", b.Size(), info.Size)
				}
			}
		}
		closeAll(t, r, fd, bufs...)
	})
}

// checkResize checks Grow's and Shrink's contract: a nil buffer comes with
// an error that is not ErrPartlyFreed and leaves old open; a new buffer
// (other than old, returned unchanged with no error) consumes old, and
// comes either alone or with an error wrapping ErrPartlyFreed.
func checkResize(t *testing.T, op string, old, nb *buffer.Buffer, err error) {
	t.Helper()
	partly := errors.Is(err, buffer.ErrPartlyFreed)
	switch {
	case nb == nil:
		if err == nil || partly || old.IsClosed() {
			t.Fatalf("%s: no buffer, error %v, old closed %v", op, err, old.IsClosed())
		}
	case nb == old:
		if err != nil {
			t.Fatalf("%s: unchanged buffer with error %v", op, err)
		}
	default:
		if (err != nil && !partly) || !old.IsClosed() {
			t.Fatalf("%s: new buffer, error %v, old closed %v", op, err, old.IsClosed())
		}
	}
}

// bigNUMA is a NUMA node past the driver's 32-bit range, held in a
// variable so that test binaries build for 32-bit targets (where int
// cannot hold it, and the seed is just another small node).
var bigNUMA int64 = 1 << 32
