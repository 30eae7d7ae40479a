package virtual

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// closeUnderWay starts b.Close on another goroutine and returns once that
// Close is under way (b refuses new calls), with a function that waits for
// its result. Hooks that run under r.mu (a Grow's driver calls) use it:
// the Close's Deallocate takes r.mu, so it cannot run on their goroutine.
func closeUnderWay(b *buffer.Buffer) (result func() error) {
	ch := make(chan error, 1)
	go func() { ch <- b.Close() }()
	for b.Use("probe", func(cuda.DevicePtr) error { return nil }) == nil {
		runtime.Gosched()
	}
	return func() error { return <-ch }
}

// raceDriver is hookDriver over a lockedFake: the calls racing a resize
// reach the driver from other goroutines while the resize makes its own
// calls (as the real driver allows). A hook runs outside the lock, once.
type raceDriver struct {
	*lockedFake
	mu                          sync.Mutex
	onReserve, onCreate, onSync func()
}

func (d *raceDriver) fire(f *func()) {
	d.mu.Lock()
	g := *f
	*f = nil
	d.mu.Unlock()
	if g != nil {
		g()
	}
}

func (d *raceDriver) MemAddressReserve(size, align uint64, hint cuda.DevicePtr) (cuda.DevicePtr, error) {
	d.fire(&d.onReserve)
	return d.lockedFake.MemAddressReserve(size, align, hint)
}

func (d *raceDriver) MemCreate(size uint64, prop *cuda.MemAllocationProp) (cuda.MemHandle, error) {
	d.fire(&d.onCreate)
	return d.lockedFake.MemCreate(size, prop)
}

func (d *raceDriver) syncStream(s *cuda.Stream) error {
	d.fire(&d.onSync)
	return d.lockedFake.syncStream(s)
}

// newRaceResource builds a Resource over a raceDriver over a fresh fake.
func newRaceResource(t *testing.T, o *Options) (*Resource, *raceDriver, *fakeDriver) {
	f := newFake(1 << 16)
	d := &raceDriver{lockedFake: &lockedFake{f: f}}
	r, err := newResource(d, fakeDevice, o)
	require.NoError(t, err)
	return r, d, f
}

// resizeRaceCase is a Grow or Shrink with a hook that runs during it.
type resizeRaceCase struct {
	name  string
	opts  Options
	setup func(t *testing.T, r *Resource, f *fakeDriver) *buffer.Buffer
	arm   func(d *raceDriver, f func())
	// underMu: the hook runs under r.mu, so what takes r.mu (a Close's or
	// a Release's Deallocate) must run on another goroutine.
	underMu bool
	op      func(r *Resource, b *buffer.Buffer) (*buffer.Buffer, error)
	opName  string
}

func resizeRaceCases() []resizeRaceCase {
	const g = 1 << 16
	return []resizeRaceCase{
		{name: "GrowInPlace", opts: Options{HandleType: HandleNone},
			setup: func(t *testing.T, r *Resource, f *fakeDriver) *buffer.Buffer {
				b, err := r.Allocate(g, nil)
				require.NoError(t, err)
				return b
			},
			arm:     func(d *raceDriver, f func()) { d.onCreate = f },
			underMu: true,
			op:      func(r *Resource, b *buffer.Buffer) (*buffer.Buffer, error) { return r.Grow(b, 4*g) },
			opName:  "Resource.Grow"},
		{name: "GrowMove", opts: Options{HandleType: HandleNone},
			setup: func(t *testing.T, r *Resource, f *fakeDriver) *buffer.Buffer {
				b, err := r.Allocate(g, nil)
				require.NoError(t, err)
				b, err = r.Grow(b, 2*g) // two chunks to move
				require.NoError(t, err)
				f.block(b.Ptr()+2*g, g) // the range after b is taken: Grow must move
				return b
			},
			arm:     func(d *raceDriver, f func()) { d.onReserve = f },
			underMu: true,
			op:      func(r *Resource, b *buffer.Buffer) (*buffer.Buffer, error) { return r.Grow(b, 5*g) },
			opName:  "Resource.Grow"},
		{name: "Shrink", opts: Options{HandleType: HandleNone},
			setup: func(t *testing.T, r *Resource, f *fakeDriver) *buffer.Buffer {
				b, err := r.Allocate(g, nil)
				require.NoError(t, err)
				b, err = r.Grow(b, 4*g) // in place: two chunks
				require.NoError(t, err)
				return b
			},
			arm:    func(d *raceDriver, f func()) { d.onSync = f }, // Shrink waits for b's stream, outside r.mu
			op:     func(r *Resource, b *buffer.Buffer) (*buffer.Buffer, error) { return r.Shrink(b, g) },
			opName: "Resource.Shrink"},
	}
}

// raceOutcome is what a resize and the calls racing it returned.
type raceOutcome struct {
	nb                *buffer.Buffer
	err               error // the resize's
	closeErr, relErr  error
	hold              *buffer.Hold
	ran               bool // the hook ran
	releaseAfterwards bool // the race leaves the Release to the test
}

// The calls racing a resize of b, run by its hook.
const (
	raceClose            = "Close"            // the owner closes b
	raceHoldCloseRelease = "HoldCloseRelease" // a DLPack export, the owner's Close, the consumer's release
	raceHoldClose        = "HoldClose"        // the same, the release after the resize
)

// runResizeRace arms tc's hook with race, then runs the resize.
func runResizeRace(t *testing.T, tc resizeRaceCase, race string, r *Resource, d *raceDriver, b *buffer.Buffer) raceOutcome {
	var out raceOutcome
	var wait []func()
	tc.arm(d, func() {
		out.ran = true
		if race != raceClose {
			var err error
			out.hold, err = b.Hold("dlpack")
			require.NoError(t, err)
		}
		switch {
		case race == raceClose && tc.underMu:
			res := closeUnderWay(b)
			wait = append(wait, func() { out.closeErr = res() })
		default:
			// Held, Close only records the free for the last Release:
			// it takes no lock of the resource.
			out.closeErr = b.Close()
		}
		switch {
		case race != raceHoldCloseRelease:
		case tc.underMu:
			ch := make(chan error, 1)
			go func() { ch <- out.hold.Release() }()
			wait = append(wait, func() { out.relErr = <-ch })
		default:
			out.relErr = out.hold.Release()
		}
	})
	out.nb, out.err = tc.op(r, b)
	for _, w := range wait {
		w()
	}
	out.releaseAfterwards = race == raceHoldClose
	return out
}

// TestCloseDuringResizeFreesOnce: b is closed while a Grow or Shrink of it
// runs, by its owner's Close alone or with a Hold taken meanwhile (a
// DLPack export) whose Release came during the resize or after it. The
// Close returns nil (it closed b), so the resize fails, and the memory is
// freed exactly once: by the Grow or Shrink once it has undone its work,
// or by the Release. The bug was the free left to a Release during the
// resize: Deallocate refused it ("being grown or shrunk"), so Release
// failed, the resize failed on the closed buffer, and the allocation
// stayed live with a closed buffer and nobody to free it (package
// dlpack's deleter counts a failed free, never retries it). A plain Close
// was refused with an error too, contradicting "Close frees".
func TestCloseDuringResizeFreesOnce(t *testing.T) {
	for _, tc := range resizeRaceCases() {
		for _, race := range []string{raceClose, raceHoldCloseRelease, raceHoldClose} {
			t.Run(tc.name+"/"+race, func(t *testing.T) {
				// A hook under r.mu has Release race the resize's undoing
				// on another goroutine: either may come first.
				runs := 1
				if tc.underMu && race == raceHoldCloseRelease {
					runs = 20
				}
				for range runs {
					r, d, f := newRaceResource(t, &tc.opts)
					b := tc.setup(t, r, f)
					out := runResizeRace(t, tc, race, r, d, b)
					require.True(t, out.ran, "the hook did not run")
					require.NoError(t, out.closeErr, "Close of a buffer being resized")
					require.NoError(t, out.relErr, "Release of a Hold of a buffer being resized")
					require.Nil(t, out.nb)
					require.Error(t, out.err)
					require.Contains(t, out.err.Error(), tc.opName)
					require.True(t, b.IsClosed())
					switch {
					case race == raceClose:
						// The Close came before the resize took b over.
						require.ErrorIs(t, out.err, cuda.ErrClosed)
						require.Contains(t, out.err.Error(), "memory freed")
					case race == raceHoldCloseRelease && !tc.underMu:
						// The Release's free was left to the resize.
						require.Contains(t, out.err.Error(), "memory freed")
					}
					checkInvariants(t, r, f)
					if out.releaseAfterwards {
						require.Len(t, r.Live(), 1, "freed under a live Hold")
						require.NoError(t, out.hold.Release())
					}
					require.Empty(t, r.Live(), "the closed buffer's allocation is still live (leaked)")
					require.NoError(t, out.hold.Release(), "a second Release")
					require.NoError(t, r.Reclaim())
					f.unblock()
					f.requireEmpty(t)
				}
			})
		}
	}
}

// TestCloseDuringResizeFaultSweep runs the races of
// TestCloseDuringResizeFreesOnce with the k-th driver call failing (and,
// sticky, every call after it), for every k the race makes. Whatever
// fails, nothing is leaked or given back twice: a failed Close or Release
// leaves its buffer open or its Hold live for a retry, a resize that took
// effect returns the buffer to close, and once the driver heals, closing
// what is open (and retrying a failed Release) and Reclaim leave the
// resource and the driver empty. No allocation may outlive its buffers.
func TestCloseDuringResizeFaultSweep(t *testing.T) {
	pairs := 0
	for _, tc := range resizeRaceCases() {
		for _, race := range []string{raceClose, raceHoldCloseRelease} {
			for _, sticky := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/%s/sticky=%v", tc.name, race, sticky), func(t *testing.T) {
					for k := 1; ; k++ {
						r, d, f := newRaceResource(t, &tc.opts)
						b := tc.setup(t, r, f)
						f.failAt(k, sticky)
						out := runResizeRace(t, tc, race, r, d, b)
						if !out.ran {
							// A call before the hook's failed: the resize
							// failed before any race (b is closed below).
							require.Error(t, out.err)
						}
						what := fmt.Sprintf("call %d (%s) failing: resize %v; close %v; release %v", k, f.lastFailed, out.err, out.closeErr, out.relErr)
						if f.failed == 0 {
							require.True(t, out.ran, "the hook did not run")
							require.NoError(t, out.closeErr, what)
							require.NoError(t, out.relErr, what)
							require.Empty(t, r.Live(), what)
							f.unblock()
							f.requireEmpty(t)
							break
						}
						pairs++
						checkInvariants(t, r, f)
						if out.nb != nil {
							require.True(t, b.IsClosed(), "%s: a new buffer, and b still open", what)
						}
						f.heal()
						if out.relErr != nil {
							// Nothing freed: the Hold is live again.
							require.NoError(t, out.hold.Release(), what)
						}
						for _, x := range []*buffer.Buffer{b, out.nb} {
							if x != nil && !x.IsClosed() {
								require.NoError(t, x.Close(), what)
							}
						}
						require.NoError(t, r.Reclaim(), what)
						require.Empty(t, r.Live(), "%s: an allocation outlived its buffers (leaked)", what)
						f.unblock()
						f.requireEmpty(t)
					}
				})
			}
		}
	}
	t.Logf("%d (race, failing call) pairs", pairs)
}

// TestCloseRacesResize runs Grow and Shrink against a Close, or a Hold,
// Close and Release, on other goroutines with no schedule imposed (run it
// with -race): every interleaving must end with each buffer either
// returned open by the resize or closed, and the memory freed exactly
// once when the survivors are closed.
func TestCloseRacesResize(t *testing.T) {
	const g = 1 << 16
	iters := 300
	if testing.Short() {
		iters = 50
	}
	paths := map[string]int{}
	defer func() { t.Logf("outcomes: %v", paths) }()
	for i := range iters {
		f := newFake(g)
		lf := &lockedFake{f: f}
		r, err := newResource(lf, fakeDevice, &Options{HandleType: HandleNone})
		require.NoError(t, err)
		b, err := r.Allocate(g, nil)
		require.NoError(t, err)
		b, err = r.Grow(b, 2*g)
		require.NoError(t, err)
		if i%3 == 2 {
			lf.mu.Lock()
			f.block(b.Ptr()+2*g, g) // the grow moves
			lf.mu.Unlock()
		}
		var wg sync.WaitGroup
		var nb *buffer.Buffer
		var resizeErr, closeErr, relErr error
		wg.Add(2)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				nb, resizeErr = r.Grow(b, 4*g)
			} else {
				nb, resizeErr = r.Shrink(b, g)
			}
		}()
		go func() {
			defer wg.Done()
			for range i % 7 {
				runtime.Gosched()
			}
			if i%4 < 2 {
				closeErr = b.Close()
				return
			}
			hold, err := b.Hold("dlpack")
			if err != nil {
				return // consumed by the resize already
			}
			closeErr = b.Close()
			relErr = hold.Release()
		}()
		wg.Wait()
		switch {
		case resizeErr == nil:
			paths["resized"]++
		case strings.Contains(resizeErr.Error(), "memory freed"):
			paths["freed by the resize"]++
		default:
			paths["failed, freed by Close or Release"]++
		}
		require.NoError(t, closeErr, "iteration %d", i)
		require.NoError(t, relErr, "iteration %d", i)
		require.True(t, b.IsClosed(), "iteration %d", i)
		lf.mu.Lock()
		checkInvariants(t, r, f)
		lf.mu.Unlock()
		if nb != nil {
			require.NoError(t, nb.Close(), "iteration %d", i)
		}
		require.Empty(t, r.Live(), "iteration %d: an allocation outlived its buffers", i)
		lf.mu.Lock()
		f.unblock()
		f.requireEmpty(t)
		lf.mu.Unlock()
	}
}

// TestDeallocateDuringResizeBehindBuffer: a caller frees the allocation
// with Deallocate, behind its open Buffer's back, while a Shrink of that
// buffer runs. Deallocate returns nil, so the memory must be freed, once:
// the Shrink takes the buffer over, finds the free, and frees instead of
// shrinking (an error matching cuda.ErrClosed, b consumed). A second
// Deallocate meanwhile is refused, not recorded twice.
func TestDeallocateDuringResizeBehindBuffer(t *testing.T) {
	const g = 1 << 16
	f := newFake(g)
	h := &hookDriver{fakeDriver: f}
	r, err := newResource(h, fakeDevice, &Options{HandleType: HandleNone})
	require.NoError(t, err)
	b, err := r.Allocate(g, nil)
	require.NoError(t, err)
	b, err = r.Grow(b, 4*g)
	require.NoError(t, err)
	ptr, size := b.Ptr(), b.Size()
	var first, second error
	h.onSync = func() {
		first = r.Deallocate(ptr, size, nil)
		second = r.Deallocate(ptr, size, nil)
	}
	nb, err := r.Shrink(b, g)
	require.NoError(t, first)
	require.ErrorIs(t, second, cuda.ErrInvalidArgument)
	require.Contains(t, second.Error(), "freed already")
	require.Nil(t, nb)
	require.ErrorIs(t, err, cuda.ErrClosed)
	require.Contains(t, err.Error(), "freed (Deallocate) while being resized")
	require.True(t, b.IsClosed(), "consumed by the Shrink")
	require.Empty(t, r.Live())
	checkInvariants(t, r, f)
	require.NoError(t, r.Reclaim())
	f.requireEmpty(t)
}
