package soak_test

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/resource"
)

// EnvDuration names the variable that sets how long TestSoak runs.
const EnvDuration = "CUDAMEM_SOAK"

const (
	producers = 128 // goroutines that allocate and fill
	consumers = 128 // goroutines that verify, copy, slice and free
	inFlight  = 64  // buffers handed over but not yet taken
	// freeSlack is how far below its starting point a device's free
	// memory may end: the driver keeps some memory for streams, events
	// and module code it created on the way.
	freeSlack = 256 << 20
)

func soakDuration(t *testing.T) time.Duration {
	v := os.Getenv(EnvDuration)
	if v == "" {
		return 3 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive Go duration such as 60s", EnvDuration, v)
	}
	return d
}

// kind is one memory resource under test.
type kind struct {
	name string
	mr   buffer.MemoryResource
	dev  *cuda.Device // the device whose memory it is; nil for host memory
	host bool         // host-accessible and page-locked: Bytes works
}

// item is a buffer in flight from its producer to its consumer, with what
// it must hold.
type item struct {
	k    *kind
	b    *buffer.Buffer
	dev  *cuda.Device // where to verify it on the device
	want []byte
	seed uint32
	gen  bool // written with the pattern kernel or the pattern: the device checks it
}

// failures collects errors from every goroutine.
type failures struct {
	n    atomic.Int64
	mu   sync.Mutex
	msgs []string
}

func (f *failures) add(format string, args ...any) {
	if f.n.Add(1) > 20 {
		return
	}
	f.mu.Lock()
	f.msgs = append(f.msgs, fmt.Sprintf(format, args...))
	f.mu.Unlock()
}

// soak holds the run's devices, kernels and resources.
type soak struct {
	devs    []*cuda.Device
	kernels map[*cuda.Device]*cudatest.Kernels
	kinds   []*kind
	fail    failures

	allocs, copies, checks atomic.Int64
}

// streams returns one stream per device for a goroutine.
func (s *soak) streams() (map[*cuda.Device]*cuda.Stream, func(), error) {
	out := map[*cuda.Device]*cuda.Stream{}
	closeAll := func() {
		for _, st := range out {
			if err := st.Close(); err != nil {
				s.fail.add("closing a stream: %v", err)
			}
		}
	}
	for _, d := range s.devs {
		st, err := d.NewStream()
		if err != nil {
			closeAll()
			return nil, nil, err
		}
		out[d] = st
	}
	return out, closeAll, nil
}

// allocDev is the device on whose stream k allocates: its own, or device
// 0 for host memory (a pinned pool's calls run in device 0's context).
func (s *soak) allocDev(k *kind) *cuda.Device {
	if k.dev != nil {
		return k.dev
	}
	return s.devs[0]
}

// size picks an allocation size: mostly small, sometimes a few MiB (large
// enough for the staged host-copy path), always a multiple of 4 so Fill32
// applies.
func size(rng *rand.Rand) uint64 {
	switch rng.IntN(32) {
	case 0:
		return 4 * uint64(1+rng.IntN(2<<20)) // up to 8 MiB
	case 1, 2, 3:
		return 4
	}
	return 4 * uint64(1+rng.IntN(16<<10)) // up to 64 KiB
}

func (s *soak) produce(rng *rand.Rand, sts map[*cuda.Device]*cuda.Stream) (*item, error) {
	k := s.kinds[rng.IntN(len(s.kinds))]
	dev := k.dev
	if dev == nil {
		dev = s.devs[rng.IntN(len(s.devs))]
	}
	st := sts[dev]
	n := size(rng)
	as := sts[s.allocDev(k)]
	b, err := buffer.Allocate(k.mr, n, as)
	if err != nil {
		return nil, fmt.Errorf("%s: Allocate(%d): %w", k.name, n, err)
	}
	s.allocs.Add(1)
	if as != st {
		// Host memory, allocated in device 0's order, used on another
		// device: the allocation must complete first.
		if err := as.Sync(); err != nil {
			b.Close()
			return nil, err
		}
	}
	it := &item{k: k, b: b, dev: dev, seed: rng.Uint32()}
	switch rng.IntN(3) {
	case 0: // written by the device
		it.gen, it.want = true, cudatest.Pattern(int(n), it.seed)
		err = s.kernels[dev].Write(st, b.Ptr(), n, it.seed)
	case 1: // copied from the host
		it.gen, it.want = true, cudatest.Pattern(int(n), it.seed)
		err = buffer.CopyFromHost(b, it.want, st)
	default: // filled
		v := byte(it.seed)
		it.want = bytes.Repeat([]byte{v}, int(n))
		err = b.Fill8(v, st)
	}
	if err == nil {
		// The consumer uses the buffer on its own streams: the data must
		// be there before the hand-over.
		err = st.Sync()
	}
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("%s: filling %d bytes: %w", k.name, n, err)
	}
	return it, nil
}

func (s *soak) consume(rng *rand.Rand, sts map[*cuda.Device]*cuda.Stream, it *item) error {
	b, n := it.b, it.b.Size()
	st := sts[it.dev]
	closed := false
	defer func() {
		if !closed {
			b.Close()
		}
	}()
	// 1. The device sees the data.
	if it.gen {
		m, err := s.kernels[it.dev].Check(st, b.Ptr(), n, it.seed)
		if err != nil {
			return fmt.Errorf("%s: device check: %w", it.k.name, err)
		}
		if m != 0 {
			return fmt.Errorf("%s: device check of %d bytes: %d differ", it.k.name, n, m)
		}
		s.checks.Add(1)
	}
	// 2. The host sees it too, through a copy and, for pinned memory, a
	// host view.
	got := make([]byte, n)
	if err := buffer.CopyToHost(got, b, st); err != nil {
		return fmt.Errorf("%s: CopyToHost: %w", it.k.name, err)
	}
	if !bytes.Equal(got, it.want) {
		return fmt.Errorf("%s: CopyToHost of %d bytes: data differs at byte %d", it.k.name, n, firstDiff(got, it.want))
	}
	if it.k.host {
		if err := st.Sync(); err != nil {
			return err
		}
		view, err := b.Bytes()
		if err != nil {
			return fmt.Errorf("%s: Bytes: %w", it.k.name, err)
		}
		if !bytes.Equal(view, it.want) {
			return fmt.Errorf("%s: host view differs at byte %d", it.k.name, firstDiff(view, it.want))
		}
		runtime.KeepAlive(b)
	}
	// 3. A slice reads its part.
	off := uint64(rng.IntN(int(n)))
	ln := uint64(rng.IntN(int(n-off) + 1))
	v, err := b.Slice(off, ln)
	if err != nil {
		return fmt.Errorf("%s: Slice(%d, %d) of %d: %w", it.k.name, off, ln, n, err)
	}
	part := make([]byte, ln)
	if err := buffer.CopyToHost(part, v, st); err != nil {
		return fmt.Errorf("%s: CopyToHost of a slice: %w", it.k.name, err)
	}
	if !bytes.Equal(part, it.want[off:off+ln]) {
		return fmt.Errorf("%s: slice [%d:+%d] differs", it.k.name, off, ln)
	}
	if err := v.Close(); err != nil {
		return err
	}
	// 4. Copy into a buffer of another kind (another GPU's memory makes it
	// a peer copy) and check the copy on its device.
	k2 := s.kinds[rng.IntN(len(s.kinds))]
	dev2 := k2.dev
	if dev2 == nil {
		dev2 = s.devs[rng.IntN(len(s.devs))]
	}
	as := sts[s.allocDev(k2)]
	c, err := buffer.Allocate(k2.mr, n, as)
	if err != nil {
		return fmt.Errorf("%s: Allocate(%d) for a copy: %w", k2.name, n, err)
	}
	s.allocs.Add(1)
	defer c.Close()
	if err := as.Sync(); err != nil { // c's allocation, before st uses it
		return err
	}
	if err := c.CopyFrom(b, st); err != nil {
		return fmt.Errorf("%s -> %s: CopyFrom: %w", it.k.name, k2.name, err)
	}
	if err := st.Sync(); err != nil {
		return err
	}
	s.copies.Add(1)
	if it.gen {
		m, err := s.kernels[dev2].Check(sts[dev2], c.Ptr(), n, it.seed)
		if err != nil {
			return fmt.Errorf("%s -> %s: device check: %w", it.k.name, k2.name, err)
		}
		if m != 0 {
			return fmt.Errorf("%s -> %s: %d of %d bytes differ after the copy", it.k.name, k2.name, m, n)
		}
	} else {
		if err := buffer.CopyToHost(got, c, sts[dev2]); err != nil {
			return err
		}
		if !bytes.Equal(got, it.want) {
			return fmt.Errorf("%s -> %s: copy differs at byte %d", it.k.name, k2.name, firstDiff(got, it.want))
		}
	}
	if err := c.Close(); err != nil {
		return fmt.Errorf("%s: Close of the copy: %w", k2.name, err)
	}
	// 5. Refill with 32-bit words and read back.
	w := rng.Uint32()
	if err := b.Fill32(w, st); err != nil {
		return fmt.Errorf("%s: Fill32: %w", it.k.name, err)
	}
	var head [4]byte
	hv, err := b.Slice(0, 4)
	if err != nil {
		return err
	}
	if err := buffer.CopyToHost(head[:], hv, st); err != nil {
		return err
	}
	hv.Close()
	if got := uint32(head[0]) | uint32(head[1])<<8 | uint32(head[2])<<16 | uint32(head[3])<<24; got != w {
		return fmt.Errorf("%s: Fill32(%#x) reads back %#x", it.k.name, w, got)
	}
	// 6. Free on this goroutine's stream, not the allocating one: half
	// the time stream-ordered, half after a sync.
	closed = true
	if rng.IntN(2) == 0 {
		err = b.CloseOn(st)
	} else if err = st.Sync(); err == nil {
		err = b.Close()
	}
	if err != nil {
		return fmt.Errorf("%s: free: %w", it.k.name, err)
	}
	return nil
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// closer is what the end of the run must close, in order.
type closer struct {
	name string
	f    func() error
}

// setup builds every resource kind on every device.
func (s *soak) setup(t *testing.T) []closer {
	var closers []closer
	add := func(name string, f func() error) { closers = append(closers, closer{name, f}) }
	need := func(name string, err error) bool {
		t.Helper()
		if errors.Is(err, cuda.ErrNotSupported) {
			t.Logf("%s: not supported here, left out: %v", name, err)
			return false
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return true
	}
	for _, d := range s.devs {
		owned, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{})
		if need("DevicePool (owned) on "+d.String(), err) {
			add("DevicePool (owned) on "+d.String(), func() error { return checkPool(owned, owned.Close) })
			s.kinds = append(s.kinds, &kind{name: "DevicePool(owned)/" + d.String(), mr: owned, dev: d})
		}
		current, err := resource.CurrentDevicePool(d)
		if need("DevicePool (current) on "+d.String(), err) {
			add("DevicePool (current) on "+d.String(), func() error {
				return checkPool(current, func() error {
					// Give the cached memory back so the free-memory check
					// sees it; closing a borrowed pool only ends this value.
					if err := current.Trim(0); err != nil {
						return err
					}
					return current.Close()
				})
			})
			s.kinds = append(s.kinds, &kind{name: "DevicePool(current)/" + d.String(), mr: current, dev: d})
		}
		managed, err := resource.NewManaged(d, nil)
		if need("Managed on "+d.String(), err) {
			s.kinds = append(s.kinds, &kind{name: "Managed/" + d.String(), mr: managed, dev: d})
		}
		sync, err := resource.NewSyncDevice(d)
		if need("SyncDevice on "+d.String(), err) {
			s.kinds = append(s.kinds, &kind{name: "SyncDevice/" + d.String(), mr: sync, dev: d})
		}
		// A sub-allocator over its own pool, and the three adaptors
		// stacked over another.
		subPool, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{})
		if need("DevicePool under the SubAllocator on "+d.String(), err) {
			sub, err := resource.NewSubAllocator(subPool, &resource.SubAllocatorOptions{GrowSize: 16 << 20})
			need("SubAllocator on "+d.String(), err)
			s.kinds = append(s.kinds, &kind{name: "SubAllocator/" + d.String(), mr: sub, dev: d})
			add("SubAllocator on "+d.String(), func() error {
				if st := sub.Stats(); st.Allocations != 0 {
					return fmt.Errorf("%d allocations still live: %+v", st.Allocations, st)
				}
				return sub.Close()
			})
			add("DevicePool under the SubAllocator on "+d.String(), func() error { return checkPool(subPool, subPool.Close) })
		}
		adPool, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{})
		if need("DevicePool under the adaptors on "+d.String(), err) {
			lim := resource.NewLimiting(adPool, 8<<30)
			stats := resource.NewStatistics(lim)
			track := resource.NewTracking(stats, nil)
			s.kinds = append(s.kinds, &kind{name: "Tracking(Statistics(Limiting(DevicePool)))/" + d.String(), mr: track, dev: d})
			add("adaptors on "+d.String(), func() error {
				if n := track.LiveCount(); n != 0 {
					return fmt.Errorf("Tracking: %d allocations live:\n%s", n, track.Report())
				}
				if st := stats.Stats(); st.CurrentBytes != 0 || st.CurrentCount != 0 {
					return fmt.Errorf("Statistics: %v", st)
				}
				if u := lim.Used(); u != 0 {
					return fmt.Errorf("Limiting: %d bytes used", u)
				}
				return nil
			})
			add("DevicePool under the adaptors on "+d.String(), func() error { return checkPool(adPool, adPool.Close) })
		}
	}
	pinned, err := resource.NewPinnedPool(nil)
	if need("PinnedPool", err) {
		s.kinds = append(s.kinds, &kind{name: "PinnedPool", mr: pinned, host: true})
		add("PinnedPool", func() error { return checkPinned(pinned) })
	}
	legacy, err := resource.NewLegacyPinned()
	if need("LegacyPinned", err) {
		s.kinds = append(s.kinds, &kind{name: "LegacyPinned", mr: legacy, host: true})
	}
	return closers
}

// syncAll waits for every device: stream-ordered frees (a sub-allocator
// giving its blocks back, say) count in a pool's UsedMemCurrent until
// they have run.
func syncAll() error {
	devs, err := cuda.Devices()
	if err != nil {
		return err
	}
	for _, d := range devs {
		if err := d.Sync(); err != nil {
			return err
		}
	}
	return nil
}

// checkPool fails unless the pool has nothing in use, then runs close.
func checkPool(p *resource.DevicePool, close func() error) error {
	if err := syncAll(); err != nil {
		return err
	}
	a, err := p.Attributes()
	if err != nil {
		return err
	}
	if a.UsedMemCurrent != 0 {
		return fmt.Errorf("pool %v: %d bytes still in use", p, a.UsedMemCurrent)
	}
	if close != nil {
		return close()
	}
	return nil
}

func checkPinned(p *resource.PinnedPool) error {
	if err := syncAll(); err != nil {
		return err
	}
	a, err := p.Attributes()
	if err != nil {
		return err
	}
	if a.UsedMemCurrent != 0 {
		return fmt.Errorf("pinned pool: %d bytes still in use", a.UsedMemCurrent)
	}
	return p.Close()
}

// warmUp launches d's kernels before the free-memory baseline is read,
// from as many goroutines and streams at once as the soak runs, so that
// whatever the driver sets aside for a context's first launches and for
// many concurrent streams is not counted against the soak. (On an H200
// with driver 580 the first launches took no free memory, yet the end of
// a 60 s soak read free memory 160 to 266 MiB below the start in three
// runs, after every pool, sub-allocator and adaptor had reported nothing
// in use, before this warm-up made its streams. The soak's other steps
// log what they cost; freeSlack covers what is left, and a real leak of
// buffers shows in the pools' and adaptors' books, checked exactly.)
func warmUp(t *testing.T, d *cuda.Device, k *cudatest.Kernels) {
	t.Helper()
	const size = 1 << 20
	p, err := d.MemAlloc(size)
	if err != nil {
		t.Fatal(err)
	}
	defer d.MemFree(p)
	s := cudatest.Stream(t, d)
	if err := k.Write(s, p, size, 1); err != nil {
		t.Fatal(err)
	}
	k.RequireCheck(t, s, p, size, 1)
	before, _, _ := d.MemInfo()
	// Every goroutine of the soak has a stream of its own on each device
	// and launches on it while the others do.
	var wg sync.WaitGroup
	errs := make(chan error, producers+consumers)
	for range producers + consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := d.NewStream()
			if err != nil {
				errs <- err
				return
			}
			if m, err := k.Check(st, p, size, 1); err != nil || m != 0 {
				errs <- fmt.Errorf("warm-up check on a new stream: %d bytes differ, %v", m, err)
			}
			errs <- st.Close()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Sync(); err != nil {
		t.Fatal(err)
	}
	after, _, _ := d.MemInfo()
	t.Logf("%v: %d streams launching at once took %d MiB of free memory", d, producers+consumers, (int64(before)-int64(after))>>20)
}

// freeAfter reads d's free memory, looking again for a few seconds while it
// is more than freeSlack below start: the driver gives freed managed
// memory back to the device lazily (a GPU run saw it come back 2 MiB at a
// time), so one early look would report a leak that is not there. Memory
// that never comes back still fails the check.
func freeAfter(d *cuda.Device, start uint64) (free uint64, looks int, err error) {
	for looks = 1; looks <= 20; looks++ {
		if looks > 1 {
			time.Sleep(250 * time.Millisecond)
		}
		if free, _, err = d.MemInfo(); err != nil {
			return 0, looks, err
		}
		if free+freeSlack >= start {
			break
		}
	}
	return free, min(looks, 20), nil
}

func TestSoak(t *testing.T) {
	cudatest.Devices(t, 1) // skips without a GPU
	all, err := cuda.Devices()
	if err != nil {
		t.Fatal(err)
	}
	s := &soak{devs: all[:min(len(all), 2)], kernels: map[*cuda.Device]*cudatest.Kernels{}}
	dur := soakDuration(t)
	for _, d := range s.devs {
		s.kernels[d] = cudatest.LoadKernels(t, d)
		before, _, _ := d.MemInfo()
		warmUp(t, d, s.kernels[d])
		after, _, _ := d.MemInfo()
		t.Logf("%v: the first launches took %d MiB of free memory", d, (int64(before)-int64(after))>>20)
	}
	leaks := buffer.Leaks()
	freeAtStart := map[*cuda.Device]uint64{}
	for _, d := range s.devs {
		if err := d.Sync(); err != nil {
			t.Fatal(err)
		}
		free, _, err := d.MemInfo()
		if err != nil {
			t.Fatal(err)
		}
		freeAtStart[d] = free
	}
	closers := s.setup(t)
	t.Logf("%d devices, %d resource kinds, %d producers, %d consumers, %v", len(s.devs), len(s.kinds), producers, consumers, dur)

	ch := make(chan *item, inFlight)
	deadline := time.Now().Add(dur)
	var prod, cons sync.WaitGroup
	var producerStreams struct {
		sync.Mutex
		close []func()
	}
	for i := range producers {
		prod.Add(1)
		go func() {
			defer prod.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 1))
			sts, closeAll, err := s.streams()
			if err != nil {
				s.fail.add("producer %d: streams: %v", i, err)
				return
			}
			// A buffer's Close frees on the stream that allocated it, so
			// the producers' streams outlive the consumers.
			producerStreams.Lock()
			producerStreams.close = append(producerStreams.close, closeAll)
			producerStreams.Unlock()
			for time.Now().Before(deadline) {
				it, err := s.produce(rng, sts)
				if err != nil {
					s.fail.add("producer %d: %v", i, err)
					return
				}
				ch <- it
			}
		}()
	}
	for i := range consumers {
		cons.Add(1)
		go func() {
			defer cons.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 2))
			sts, closeAll, err := s.streams()
			if err != nil {
				s.fail.add("consumer %d: streams: %v", i, err)
				for it := range ch { // keep draining so producers finish
					it.b.Close()
				}
				return
			}
			defer closeAll()
			for it := range ch {
				if err := s.consume(rng, sts, it); err != nil {
					s.fail.add("consumer %d: %v", i, err)
				}
			}
		}()
	}
	prod.Wait()
	close(ch)
	cons.Wait()
	for _, f := range producerStreams.close {
		f()
	}
	t.Logf("%d allocations, %d buffer copies, %d device-side checks", s.allocs.Load(), s.copies.Load(), s.checks.Load())

	for _, d := range s.devs {
		if err := d.Sync(); err != nil {
			s.fail.add("%v: Sync at the end: %v", d, err)
		}
	}
	for _, c := range closers {
		if err := c.f(); err != nil {
			s.fail.add("%s at the end: %v", c.name, err)
		}
	}
	if got := buffer.Leaks(); got != leaks {
		s.fail.add("buffer.Leaks() went from %d to %d: buffers were collected without Close", leaks, got)
	}
	for _, d := range s.devs {
		if err := d.Sync(); err != nil {
			s.fail.add("%v: Sync after closing: %v", d, err)
			continue
		}
		free, looks, err := freeAfter(d, freeAtStart[d])
		if err != nil {
			s.fail.add("%v: MemInfo: %v", d, err)
			continue
		}
		t.Logf("%v: free memory %d MiB at the start, %d MiB at the end (%d looks)", d, freeAtStart[d]>>20, free>>20, looks)
		if free+freeSlack < freeAtStart[d] {
			s.fail.add("%v: free memory fell from %d to %d bytes (more than %d)", d, freeAtStart[d], free, freeSlack)
		}
	}
	if n := s.fail.n.Load(); n != 0 {
		for _, m := range s.fail.msgs {
			t.Error(m)
		}
		t.Fatalf("%d errors in the soak (the first %d above)", n, len(s.fail.msgs))
	}
}
