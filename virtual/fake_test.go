package virtual

import (
	"fmt"
	"sort"
	"testing"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
)

// fakeDriver is a CPU model of the driver's VMM calls, strict where the
// real one is: mapping outside a reservation or over a mapping, unmapping
// what is not mapped, releasing a handle twice, freeing a range that still
// has mappings in it, or setting access on unmapped memory are errors. Any
// call can be made to fail: the fail-th call from now (and, with sticky,
// every call after it).
type fakeDriver struct {
	gran  uint64
	feats cuda.Features

	calls  int         // driver calls made
	fail   int         // the call number that fails (0: none)
	sticky bool        // every call from fail on fails
	failed int         // calls failed by injection
	with   cuda.Result // the injected error
	log    []string    // names of the calls made, for failure messages

	next    uint64
	resv    map[cuda.DevicePtr]uint64
	handles map[cuda.MemHandle]fakeHandle
	nextH   cuda.MemHandle
	maps    map[cuda.DevicePtr]fakeMap
	syncs   int
	bad     []string // misuse the driver would have refused or crashed on

	blockers map[cuda.DevicePtr]bool // reservations a test made to block growth

	lastFailed string // the name of the last call failed

	failName string // with failNth: fail the failNth call of this name
	failNth  int
	named    int

	aligns []uint64 // the alignment of every cuMemAddressReserve, in order
	// offGranule makes reservations without a hint land half a granule
	// off the granularity, whatever alignment was asked for: a driver
	// that ignores the alignment, as no real one has been seen to do.
	offGranule bool

	fab fakeFabric // fabric handles and read-back properties (fabric_fake_test.go)

	hosts       map[*byte]uint64 // live pinned host allocations (sleep_test.go)
	deviceSyncs int
	streams     int // live streams of Wake's
}

type fakeHandle struct {
	size     uint64
	released bool   // released, but still alive while mapped
	data     []byte // the contents, made by the first copy that touches them
}

type fakeMap struct {
	size   uint64
	h      cuda.MemHandle
	access map[cuda.MemLocation]cuda.MemAccessFlags
}

const (
	fakeBase = 0x7f0000000000
	fakeVA   = 1 << 48 // the address space the fake pretends to have
)

func newFake(gran uint64) *fakeDriver {
	return &fakeDriver{
		gran:    gran,
		feats:   cuda.Features{VirtualMemory: true, PosixFDHandles: true, GPUDirectRDMAWithVMM: true},
		with:    cuda.ErrorUnknown,
		next:    fakeBase,
		resv:    map[cuda.DevicePtr]uint64{},
		handles: map[cuda.MemHandle]fakeHandle{},
		maps:    map[cuda.DevicePtr]fakeMap{},
		nextH:   0x100,
		hosts:   map[*byte]uint64{},

		blockers: map[cuda.DevicePtr]bool{},
	}
}

// failCall makes the nth call named name from now fail (and, with
// sticky, every driver call after it).
func (f *fakeDriver) failCall(name string, nth int, sticky bool) {
	f.failName, f.failNth, f.named, f.sticky = name, nth, 0, sticky
}

// block reserves [p, p+size) behind the resource's back, as another
// allocation would.
func (f *fakeDriver) block(p cuda.DevicePtr, size uint64) {
	f.resv[p] = size
	f.blockers[p] = true
}

func (f *fakeDriver) unblock() {
	for p := range f.blockers {
		delete(f.resv, p)
	}
	clear(f.blockers)
}

// failAt makes the k-th call from now fail (k >= 1).
func (f *fakeDriver) failAt(k int, sticky bool) {
	f.fail, f.sticky = f.calls+k, sticky
}

func (f *fakeDriver) heal() { f.fail, f.sticky, f.failName = 0, false, "" }

func (f *fakeDriver) call(name string) error {
	f.calls++
	f.log = append(f.log, name)
	if f.failName == name {
		f.named++
		if f.named == f.failNth {
			f.fail = f.calls // from here on it works as failAt
		}
	}
	if f.fail != 0 && (f.calls == f.fail || f.sticky && f.calls > f.fail) {
		f.failed++
		f.lastFailed = name
		return &cuda.OpError{Op: name, Err: f.with}
	}
	return nil
}

func (f *fakeDriver) misuse(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	f.bad = append(f.bad, msg)
	return &cuda.OpError{Op: "fake", Err: fmt.Errorf("%w: %s", cuda.ErrorInvalidValue, msg)}
}

func (f *fakeDriver) Features() (cuda.Features, error) {
	if err := f.call("Features"); err != nil {
		return cuda.Features{}, err
	}
	return f.feats, nil
}

func (f *fakeDriver) AllocationGranularity(prop *cuda.MemAllocationProp, kind cuda.MemAllocationGranularity) (uint64, error) {
	if err := f.call("cuMemGetAllocationGranularity"); err != nil {
		return 0, err
	}
	return f.gran, nil
}

func (f *fakeDriver) MemCreate(size uint64, prop *cuda.MemAllocationProp) (cuda.MemHandle, error) {
	if err := f.call("cuMemCreate"); err != nil {
		return 0, err
	}
	if size == 0 || size%f.gran != 0 {
		return 0, f.misuse("cuMemCreate of %d bytes (granularity %d)", size, f.gran)
	}
	if prop.Type != cuda.MemAllocationTypePinned && prop.Type != cuda.MemAllocationTypeManaged {
		return 0, f.misuse("cuMemCreate with allocation type %d", prop.Type)
	}
	if err := f.fab.refused("cuMemCreate", prop); err != nil {
		return 0, err
	}
	f.nextH++
	f.handles[f.nextH] = fakeHandle{size: size}
	f.fab.created(f.nextH, prop)
	return f.nextH, nil
}

func (f *fakeDriver) MemRelease(h cuda.MemHandle) error {
	if err := f.call("cuMemRelease"); err != nil {
		return err
	}
	if f.fab.unretain(h) {
		return nil // a retain's release (cuMemRetainAllocationHandle)
	}
	fh, ok := f.handles[h]
	if !ok || fh.released {
		return f.misuse("cuMemRelease of handle %#x: not live (double free?)", uint64(h))
	}
	fh.released = true
	f.handles[h] = fh
	f.collect(h)
	return nil
}

// collect drops a released handle once nothing maps it.
func (f *fakeDriver) collect(h cuda.MemHandle) {
	if !f.handles[h].released {
		return
	}
	for _, m := range f.maps {
		if m.h == h {
			return
		}
	}
	delete(f.handles, h)
}

func overlap(p1 cuda.DevicePtr, s1 uint64, p2 cuda.DevicePtr, s2 uint64) bool {
	return uint64(p1) < uint64(p2)+s2 && uint64(p2) < uint64(p1)+s1
}

func (f *fakeDriver) MemAddressReserve(size, alignment uint64, hint cuda.DevicePtr) (cuda.DevicePtr, error) {
	if err := f.call("cuMemAddressReserve"); err != nil {
		return 0, err
	}
	f.aligns = append(f.aligns, alignment)
	if size == 0 || size%f.gran != 0 || alignment&(alignment-1) != 0 {
		return 0, f.misuse("cuMemAddressReserve of %d bytes aligned to %d", size, alignment)
	}
	if f.offGranule && hint == 0 { // a driver that ignores the alignment
		for {
			p := cuda.DevicePtr((f.next+f.gran-1)/f.gran*f.gran + f.gran/2)
			f.next = uint64(p) + size + f.gran
			if _, ok := f.resv[p]; !ok {
				f.resv[p] = size
				return p, nil
			}
		}
	}
	if alignment == 0 { // the driver's default
		alignment = f.gran
	}
	if size > fakeVA || alignment > fakeVA {
		return 0, &cuda.OpError{Op: "cuMemAddressReserve", Err: cuda.ErrorOutOfMemory} // more than the address space
	}
	free := func(p cuda.DevicePtr) bool {
		if uint64(p)+size < uint64(p) {
			return false
		}
		for q, n := range f.resv {
			if overlap(p, size, q, n) {
				return false
			}
		}
		return true
	}
	if hint != 0 && uint64(hint)%alignment == 0 && free(hint) {
		f.resv[hint] = size
		return hint, nil
	}
	for {
		p := cuda.DevicePtr((f.next + alignment - 1) / alignment * alignment)
		f.next = uint64(p) + size + f.gran // leave a gap: growing in place needs a hint that fits
		if free(p) {
			f.resv[p] = size
			return p, nil
		}
	}
}

func (f *fakeDriver) MemAddressFree(ptr cuda.DevicePtr, size uint64) error {
	if err := f.call("cuMemAddressFree"); err != nil {
		return err
	}
	if n, ok := f.resv[ptr]; !ok || n != size {
		return f.misuse("cuMemAddressFree(%#x, %d): not a reservation", uint64(ptr), size)
	}
	for p, m := range f.maps {
		if overlap(p, m.size, ptr, size) {
			return f.misuse("cuMemAddressFree(%#x, %d) with %#x still mapped", uint64(ptr), size, uint64(p))
		}
	}
	delete(f.resv, ptr)
	return nil
}

// inReservation reports whether [p, p+size) lies in reservations (which
// may be several back to back).
func (f *fakeDriver) inReservation(p cuda.DevicePtr, size uint64) bool {
	for size > 0 {
		found := false
		for q, n := range f.resv {
			if p >= q && uint64(p) < uint64(q)+n {
				step := min(size, uint64(q)+n-uint64(p))
				p += cuda.DevicePtr(step)
				size -= step
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func (f *fakeDriver) MemMap(ptr cuda.DevicePtr, size, offset uint64, h cuda.MemHandle) error {
	if err := f.call("cuMemMap"); err != nil {
		return err
	}
	fh, ok := f.handles[h]
	if !ok || fh.released {
		return f.misuse("cuMemMap of handle %#x: not live", uint64(h))
	}
	if offset != 0 || size != fh.size {
		return f.misuse("cuMemMap of %d bytes at offset %d of a %d-byte handle", size, offset, fh.size)
	}
	if !f.inReservation(ptr, size) {
		return f.misuse("cuMemMap at %#x (%d bytes): not reserved", uint64(ptr), size)
	}
	for p, m := range f.maps {
		if overlap(p, m.size, ptr, size) {
			return f.misuse("cuMemMap at %#x (%d bytes): over the mapping at %#x", uint64(ptr), size, uint64(p))
		}
	}
	f.maps[ptr] = fakeMap{size: size, h: h, access: map[cuda.MemLocation]cuda.MemAccessFlags{}}
	return nil
}

// MemUnmap unmaps [ptr, ptr+size), which must be one mapping or several
// back to back, each whole (the driver unmaps a run of mappings in one
// call: the C anchor unmaps 4096 at once; it refuses a part of one).
func (f *fakeDriver) MemUnmap(ptr cuda.DevicePtr, size uint64) error {
	if err := f.call("cuMemUnmap"); err != nil {
		return err
	}
	ms, ok := f.mappingsIn(ptr, size)
	if !ok {
		return f.misuse("cuMemUnmap(%#x, %d): not whole mappings", uint64(ptr), size)
	}
	for _, p := range ms {
		h := f.maps[p].h
		delete(f.maps, p)
		f.collect(h)
	}
	return nil
}

// mappingsIn returns the mappings covering exactly [ptr, ptr+size), in
// order, or false if any byte is unmapped.
func (f *fakeDriver) mappingsIn(ptr cuda.DevicePtr, size uint64) ([]cuda.DevicePtr, bool) {
	var out []cuda.DevicePtr
	for size > 0 {
		m, ok := f.maps[ptr]
		if !ok || m.size > size {
			return nil, false
		}
		out = append(out, ptr)
		ptr += cuda.DevicePtr(m.size)
		size -= m.size
	}
	return out, true
}

func (f *fakeDriver) MemSetAccess(ptr cuda.DevicePtr, size uint64, descs ...cuda.MemAccessDesc) error {
	if err := f.call("cuMemSetAccess"); err != nil {
		return err
	}
	ms, ok := f.mappingsIn(ptr, size)
	if !ok || len(descs) == 0 {
		return f.misuse("cuMemSetAccess(%#x, %d) over unmapped memory (or no descriptors)", uint64(ptr), size)
	}
	for _, p := range ms {
		for _, d := range descs {
			if d.Flags == cuda.MemAccessProtNone {
				delete(f.maps[p].access, d.Location) // no access is no entry
				continue
			}
			f.maps[p].access[d.Location] = d.Flags
		}
	}
	return nil
}

func (f *fakeDriver) MemGetAccess(ptr cuda.DevicePtr, loc cuda.MemLocation) (cuda.MemAccessFlags, error) {
	if err := f.call("cuMemGetAccess"); err != nil {
		return 0, err
	}
	m, ok := f.maps[ptr]
	if !ok {
		return 0, f.misuse("cuMemGetAccess(%#x): not mapped", uint64(ptr))
	}
	return m.access[loc], nil
}

// MemExportFD hands out a made-up descriptor number (the fake opens no
// files); MemImportFD turns a descriptor into a new live handle, of the
// exported handle's size (one granule for descriptors it never made).
func (f *fakeDriver) MemExportFD(h cuda.MemHandle) (int, error) {
	if err := f.call("cuMemExportToShareableHandle"); err != nil {
		return -1, err
	}
	if fh, ok := f.handles[h]; !ok || fh.released {
		return -1, f.misuse("export of handle %#x: not live", uint64(h))
	}
	return 1000 + int(h), nil
}

func (f *fakeDriver) MemImportFD(fd int) (cuda.MemHandle, error) {
	if err := f.call("cuMemImportFromShareableHandle"); err != nil {
		return 0, err
	}
	if fd < 0 {
		return 0, f.misuse("import of fd %d", fd)
	}
	size := f.gran
	if fh, ok := f.handles[cuda.MemHandle(fd-1000)]; ok {
		size = fh.size // a descriptor this fake exported: the same memory's size
	}
	f.nextH++
	f.handles[f.nextH] = fakeHandle{size: size}
	return f.nextH, nil
}

func (f *fakeDriver) syncStream(s *cuda.Stream) error {
	if err := f.call("cuStreamSynchronize"); err != nil {
		return err
	}
	f.syncs++
	return nil
}

func (f *fakeDriver) peerCanAccess(peer *cuda.Device) (bool, error) {
	if err := f.call("cuDeviceCanAccessPeer"); err != nil {
		return false, err
	}
	return true, nil
}

// empty fails t unless every reservation, mapping and handle is gone.
func (f *fakeDriver) requireEmpty(t testing.TB) {
	t.Helper()
	if len(f.resv)+len(f.maps)+len(f.handles)+len(f.hosts)+f.streams != 0 {
		t.Fatalf("driver resources left: %d reservations, %d mappings, %d handles, %d pinned host allocations, %d streams", len(f.resv), len(f.maps), len(f.handles), len(f.hosts), f.streams)
	}
	f.requireSane(t)
}

func (f *fakeDriver) requireSane(t testing.TB) {
	t.Helper()
	if len(f.bad) > 0 {
		t.Fatalf("driver misuse: %q", f.bad)
	}
}

// state is a comparable picture of the driver's resources.
func (f *fakeDriver) state() string {
	var rs, ms, hs []string
	for p, n := range f.resv {
		rs = append(rs, fmt.Sprintf("%#x+%d", uint64(p), n))
	}
	for p, m := range f.maps {
		var acc []string
		for l, fl := range m.access {
			acc = append(acc, fmt.Sprintf("%v=%d", l, fl))
		}
		sort.Strings(acc)
		ms = append(ms, fmt.Sprintf("%#x+%d->%#x%v", uint64(p), m.size, uint64(m.h), acc))
	}
	for h, fh := range f.handles {
		hs = append(hs, fmt.Sprintf("%#x:%d:%v", uint64(h), fh.size, fh.released))
	}
	sort.Strings(rs)
	sort.Strings(ms)
	sort.Strings(hs)
	return fmt.Sprintf("resv %v\nmaps %v\nhandles %v", rs, ms, hs)
}

// Device values for CPU tests: the fake answers every driver call, so
// nothing reaches the cuda package; ordinal tells them apart.
var (
	fakeDevice = new(cuda.Device)
	fakePeer1  = new(cuda.Device)
	fakePeer2  = new(cuda.Device)
	fakeOrd    = map[*cuda.Device]int{fakeDevice: 0, fakePeer1: 1, fakePeer2: 2}
)

func init() {
	real := ordinal
	ordinal = func(d *cuda.Device) int {
		if n, ok := fakeOrd[d]; ok {
			return n
		}
		return real(d)
	}
}

// newFakeResource builds a Resource over a fresh fake driver.
func newFakeResource(t testing.TB, gran uint64, o *Options) (*Resource, *fakeDriver) {
	t.Helper()
	f := newFake(gran)
	if o == nil {
		o = &Options{HandleType: HandleNone}
	}
	r, err := newResource(f, fakeDevice, o)
	if err != nil {
		t.Fatalf("newResource: %v", err)
	}
	return r, f
}

// checkInvariants fails t unless every allocation of r is consistent and
// matches the fake driver exactly, and every driver resource belongs to an
// allocation or to r's leftovers (nothing leaked, nothing lost).
func checkInvariants(t testing.TB, r *Resource, f *fakeDriver) {
	t.Helper()
	f.requireSane(t)
	r.mu.Lock()
	defer r.mu.Unlock()
	ownMaps := map[cuda.DevicePtr]bool{}
	ownHandles := map[cuda.MemHandle]bool{}
	ownResv := map[cuda.DevicePtr]bool{}
	for key, a := range r.allocs {
		if key != a.base {
			t.Fatalf("allocation at %#x filed under %#x", uint64(a.base), uint64(key))
		}
		for _, s := range a.reservations {
			if n, ok := f.resv[s.ptr]; !ok || n != s.size {
				t.Fatalf("allocation %#x: reservation %#x+%d not in the driver", uint64(a.base), uint64(s.ptr), s.size)
			}
			ownResv[s.ptr] = true
		}
		for _, c := range a.chunks {
			if ownHandles[c.h] {
				t.Fatalf("handle %#x held twice", uint64(c.h))
			}
			ownHandles[c.h] = true
			if fh, ok := f.handles[c.h]; !ok || fh.released || fh.size != c.size {
				t.Fatalf("allocation %#x: chunk %+v: driver handle %+v (present %v)", uint64(a.base), c, fh, ok)
			}
			at := a.base + cuda.DevicePtr(c.off)
			m, ok := f.maps[at]
			if !ok || m.h != c.h || m.size != c.size {
				t.Fatalf("allocation %#x: chunk at offset %d not mapped as recorded (%+v, %v)", uint64(a.base), c.off, m, ok)
			}
			ownMaps[at] = true
			for _, d := range a.descs {
				if m.access[d.Location] != d.Flags {
					t.Fatalf("allocation %#x: chunk at offset %d: access for %v is %d, recorded %d", uint64(a.base), c.off, d.Location, m.access[d.Location], d.Flags)
				}
			}
		}
		var off uint64
		for _, c := range a.chunks {
			if c.off != off {
				t.Fatalf("allocation %#x: chunks %+v do not cover [0, %d) in order", uint64(a.base), a.chunks, a.mapped)
			}
			off += c.size
		}
		need, _ := roundUp(a.size, r.gran)
		if s := a.sleep; s != nil {
			var sum uint64
			for _, n := range s.sizes {
				sum += n
			}
			if len(a.chunks) != 0 || a.mapped != 0 || sum != s.mapped || need > s.mapped || s.mapped > a.resv {
				t.Fatalf("asleep allocation %#x: %d chunks, mapped %d, sleeping sizes %v (total %d, recorded %d), size %d, reserved %d", uint64(a.base), len(a.chunks), a.mapped, s.sizes, sum, s.mapped, a.size, a.resv)
			}
		} else if off != a.mapped || a.size == 0 || need > a.mapped || a.mapped > a.resv {
			t.Fatalf("allocation %#x: size %d, mapped %d, chunks cover %d, reserved %d", uint64(a.base), a.size, a.mapped, off, a.resv)
		}
		var roff uint64
		for _, s := range a.reservations {
			if s.ptr != a.base+cuda.DevicePtr(roff) {
				t.Fatalf("allocation %#x: reservations %+v not contiguous", uint64(a.base), a.reservations)
			}
			roff += s.size
		}
		if roff != a.resv {
			t.Fatalf("allocation %#x: reservations total %d, recorded %d", uint64(a.base), roff, a.resv)
		}
	}
	r.left.mu.Lock()
	l := r.left.l
	r.left.mu.Unlock()
	for _, m := range l.maps {
		// A kept unmap may cover several mappings back to back (the old
		// range of a moved allocation): it owns every mapping inside.
		for p, fm := range f.maps {
			if p >= m.ptr && uint64(p)+fm.size <= uint64(m.ptr)+m.size {
				ownMaps[p] = true
			}
		}
	}
	for _, h := range l.handles {
		ownHandles[h] = true
	}
	for _, s := range l.spans {
		ownResv[s.ptr] = true
	}
	for p := range f.maps {
		if !ownMaps[p] {
			t.Fatalf("mapping at %#x belongs to nothing (leaked)", uint64(p))
		}
	}
	for h, fh := range f.handles {
		if !fh.released && !ownHandles[h] {
			t.Fatalf("handle %#x belongs to nothing (leaked)", uint64(h))
		}
	}
	for p := range f.resv {
		if !ownResv[p] && !f.blockers[p] {
			t.Fatalf("reservation at %#x belongs to nothing (leaked)", uint64(p))
		}
	}
}

func (f *fakeDriver) syncDevice() error {
	if err := f.call("cuCtxSynchronize"); err != nil {
		return err
	}
	f.deviceSyncs++
	return nil
}

func (f *fakeDriver) hostAlloc(size uint64) ([]byte, error) {
	if err := f.call("cuMemHostAlloc"); err != nil {
		return nil, err
	}
	if size == 0 {
		return nil, f.misuse("cuMemHostAlloc of 0 bytes")
	}
	mem := make([]byte, size)
	for i := range mem {
		mem[i] = 0xee // not zero: what a copy did not write shows
	}
	f.hosts[&mem[0]] = size
	return mem, nil
}

func (f *fakeDriver) hostFree(mem []byte) error {
	if err := f.call("cuMemFreeHost"); err != nil {
		return err
	}
	if len(mem) == 0 || f.hosts[&mem[0]] != uint64(len(mem)) {
		return f.misuse("cuMemFreeHost of %d bytes: not a pinned allocation (double free?)", len(mem))
	}
	delete(f.hosts, &mem[0])
	return nil
}

// pinned reports whether mem lies in a live pinned allocation.
func (f *fakeDriver) pinned(mem []byte) bool {
	if len(mem) == 0 {
		return false
	}
	p := uintptr(unsafe.Pointer(&mem[0]))
	for b, n := range f.hosts {
		q := uintptr(unsafe.Pointer(b))
		if p >= q && p+uintptr(len(mem)) <= q+uintptr(n) {
			return true
		}
	}
	return false
}

// touch runs f over the contents behind [p, p+n), mapping by mapping; any
// byte not mapped is misuse (on a GPU, a fault).
func (f *fakeDriver) touch(op string, p cuda.DevicePtr, n uint64, fn func(mem []byte, at uint64)) error {
	var done uint64
	for done < n {
		at := p + cuda.DevicePtr(done)
		found := false
		for q, m := range f.maps {
			if at >= q && uint64(at) < uint64(q)+m.size {
				fh := f.handles[m.h]
				if fh.data == nil {
					fh.data = make([]byte, fh.size)
					f.handles[m.h] = fh
				}
				off := uint64(at - q)
				k := min(n-done, m.size-off)
				fn(fh.data[off:off+k], done)
				done += k
				found = true
				break
			}
		}
		if !found {
			return f.misuse("%s at %#x: not mapped (a GPU fault)", op, uint64(at))
		}
	}
	return nil
}

func (f *fakeDriver) copyDtoH(dst []byte, src cuda.DevicePtr) error {
	if err := f.call("cuMemcpyDtoH"); err != nil {
		return err
	}
	if !f.pinned(dst) {
		return f.misuse("cuMemcpyDtoH into memory that is not pinned")
	}
	return f.touch("cuMemcpyDtoH", src, uint64(len(dst)), func(mem []byte, at uint64) { copy(dst[at:], mem) })
}

func (f *fakeDriver) copyHtoD(dst cuda.DevicePtr, src []byte) error {
	if err := f.call("cuMemcpyHtoD"); err != nil {
		return err
	}
	if !f.pinned(src) {
		return f.misuse("cuMemcpyHtoD from memory that is not pinned")
	}
	return f.touch("cuMemcpyHtoD", dst, uint64(len(src)), func(mem []byte, at uint64) { copy(mem, src[at:]) })
}

// write and read are the test's own access to device memory (a kernel's,
// say): they bypass the driver-call count and failure injection.
func (f *fakeDriver) write(p cuda.DevicePtr, b []byte) error {
	return f.touch("write", p, uint64(len(b)), func(mem []byte, at uint64) { copy(mem, b[at:]) })
}

func (f *fakeDriver) read(p cuda.DevicePtr, n uint64) ([]byte, error) {
	out := make([]byte, n)
	err := f.touch("read", p, n, func(mem []byte, at uint64) { copy(out[at:], mem) })
	return out, err
}

func (f *fakeDriver) newStream() (*cuda.Stream, error) {
	if err := f.call("cuStreamCreate"); err != nil {
		return nil, err
	}
	f.streams++
	return nil, nil // the fake's copies are synchronous; syncStream ignores the stream
}

func (f *fakeDriver) closeStream(*cuda.Stream) error {
	if err := f.call("cuStreamDestroy"); err != nil {
		return err
	}
	if f.streams == 0 {
		return f.misuse("cuStreamDestroy of a stream not created")
	}
	f.streams--
	return nil
}

func (f *fakeDriver) copyHtoDAsync(dst cuda.DevicePtr, src []byte, _ *cuda.Stream) error {
	if err := f.call("cuMemcpyHtoDAsync"); err != nil {
		return err
	}
	if !f.pinned(src) {
		return f.misuse("cuMemcpyHtoDAsync from memory that is not pinned")
	}
	return f.touch("cuMemcpyHtoDAsync", dst, uint64(len(src)), func(mem []byte, at uint64) { copy(mem, src[at:]) })
}
