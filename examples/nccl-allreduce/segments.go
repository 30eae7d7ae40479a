package main

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"unsafe"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/virtual"
)

// SegmentStats counts what the registered phase's SegmentHooks did.
type SegmentStats struct {
	Registered   int // blocks the Acquired hook gave to ncclCommRegister
	Deregistered int // blocks the Released hook gave to ncclCommDeregister
	ByTrim       int // deregistered when SubAllocator.Trim gave a free block back
	// AtClose is what SubAllocator.Close deregistered while the phase's
	// buffers were still live: their blocks stay in use, so none.
	AtClose int
	// AfterClose is what the buffers' own Close deregistered, after the
	// SubAllocator's: each block goes, and is deregistered, at its last
	// allocation's free.
	AfterClose int
	Live       int // registered and not deregistered when the phase ended
	// Problems lists misuse the hooks saw: a block registered twice, one
	// released that was not registered (released twice), one released
	// with another size, or one whose memory had already left the upstream
	// when Released ran.
	Problems []string
}

func (s *SegmentStats) add(o SegmentStats) {
	s.Registered += o.Registered
	s.Deregistered += o.Deregistered
	s.ByTrim += o.ByTrim
	s.AtClose += o.AtClose
	s.AfterClose += o.AfterClose
	s.Live += o.Live
	s.Problems = append(s.Problems, o.Problems...)
}

// verify checks what the registered phase must show for ranks local
// ranks: every registered block deregistered exactly once, before its
// memory went back; one given back by Trim per rank; none by a Close with
// live buffers, and at least one per rank by the buffers' Close after it.
func (s SegmentStats) verify(ranks int) error {
	var errs []error
	for _, p := range s.Problems {
		errs = append(errs, errors.New(p))
	}
	if s.Live != 0 || s.Registered != s.Deregistered {
		errs = append(errs, fmt.Errorf("%d blocks registered, %d deregistered, %d still registered", s.Registered, s.Deregistered, s.Live))
	}
	if s.ByTrim < ranks {
		errs = append(errs, fmt.Errorf("%d blocks deregistered by Trim over %d rank(s), want one each", s.ByTrim, ranks))
	}
	if s.AtClose != 0 {
		errs = append(errs, fmt.Errorf("SubAllocator.Close deregistered %d blocks while their buffers were live", s.AtClose))
	}
	if s.AfterClose < ranks {
		errs = append(errs, fmt.Errorf("the buffers' Close after SubAllocator.Close deregistered %d blocks over %d rank(s), want at least one each", s.AfterClose, ranks))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("segment hooks: %w", err)
	}
	return nil
}

// registrar registers a SubAllocator's blocks with one rank's
// communicator: its Acquired and Released are the SegmentHooks.
type registrar struct {
	n  *nccl
	rk *rank

	mu    sync.Mutex
	live  map[cuda.DevicePtr]registration
	stats SegmentStats
}

type registration struct {
	handle uintptr // ncclCommRegister's (NULL when NCCL_LOCAL_REGISTER=0)
	size   uint64
}

func newRegistrar(n *nccl, rk *rank) *registrar {
	return &registrar{n: n, rk: rk, live: map[cuda.DevicePtr]registration{}}
}

func (r *registrar) hooks() *resource.SegmentHooks {
	return &resource.SegmentHooks{Acquired: r.acquired, Released: r.released}
}

func (r *registrar) problem(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stats.Problems = append(r.stats.Problems, fmt.Sprintf("rank %d: ", r.rk.id)+fmt.Sprintf(format, args...))
}

func (r *registrar) deregistered() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stats.Deregistered
}

// acquired registers a block the SubAllocator just took from the
// upstream; an error gives the block back and fails the allocation.
func (r *registrar) acquired(p cuda.DevicePtr, size uint64) error {
	var h uintptr
	res, err := r.rk.register.Call(r.rk.comm, uintptr(p), uintptr(size), uintptr(unsafe.Pointer(&h)))
	if err := r.n.check("ncclCommRegister", res, err); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.live[p]; dup {
		r.stats.Problems = append(r.stats.Problems, fmt.Sprintf("rank %d: block %#x acquired twice", r.rk.id, uint64(p)))
	}
	r.live[p] = registration{handle: h, size: size}
	r.stats.Registered++
	return nil
}

// released deregisters a block before the SubAllocator gives it back; an
// error keeps the block (still registered) for the next Trim or Close.
func (r *registrar) released(p cuda.DevicePtr, size uint64) error {
	r.mu.Lock()
	reg, ok := r.live[p]
	r.mu.Unlock()
	switch {
	case !ok:
		r.problem("block %#x (%d bytes) released but not registered (released twice, or never acquired)", uint64(p), size)
		return nil
	case reg.size != size:
		r.problem("block %#x registered with %d bytes, released with %d", uint64(p), reg.size, size)
	}
	// The hook runs before the block goes back: its memory must still be
	// an allocation of the upstream.
	if !slices.Contains(r.rk.vmm.Live(), p) {
		r.problem("block %#x released after its memory left the upstream", uint64(p))
	}
	res, err := r.rk.deregister.Call(r.rk.comm, reg.handle)
	if err := r.n.check("ncclCommDeregister", res, err); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.live, p)
	r.stats.Deregistered++
	return nil
}

// ensureVMM gives rk the NCCLOptions virtual-memory resource, or says why
// the device has none.
func ensureVMM(rk *rank) (skip string, err error) {
	if rk.vmm != nil {
		return "", nil
	}
	opts, err := virtual.NCCLOptions(rk.dev)
	if errors.Is(err, cuda.ErrNotSupported) {
		return fmt.Sprintf("%v: %v", rk.dev, err), nil
	}
	if err != nil {
		return "", err
	}
	if rk.vmm, err = virtual.New(rk.dev, opts); err != nil {
		return "", err
	}
	return "", nil
}

// registeredPhase all-reduces Buffers carved by a SubAllocator from
// NCCLOptions memory, whose blocks the SegmentHooks register with the
// communicator as they come and deregister before they go. It checks the
// hooks' counts: a block given back by Trim, a Close with live buffers
// (nothing deregistered until the buffers go), the buffers' Close after
// it (their blocks deregistered then).
func (g *group) registeredPhase(ph *Phase, st *SegmentStats, size, count uint64, iters int) (err error) {
	if err := g.n.need("registered buffers need NCCL 2.19 or later", &g.n.commRegister, &g.n.commDeregister); err != nil {
		ph.Skipped = err.Error()
		return nil
	}
	regs := make([]*registrar, len(g.ranks))
	subs := make([]*resource.SubAllocator, len(g.ranks))
	bufs := make([]pair, len(g.ranks))
	defer func() {
		if err != nil { // buffers, then sub-allocators: every block deregistered before the communicators go
			err = errors.Join(err, closeAll(bufs))
			for _, a := range subs {
				if a != nil {
					err = errors.Join(err, a.Close())
				}
			}
		}
		for _, r := range regs {
			if r != nil {
				r.mu.Lock()
				r.stats.Live = len(r.live)
				st.add(r.stats)
				r.mu.Unlock()
			}
		}
		if err == nil {
			err = st.verify(len(g.ranks))
		}
	}()
	for i, rk := range g.ranks {
		skip, err := ensureVMM(rk)
		if err != nil {
			return err
		}
		if skip != "" {
			ph.Skipped = skip
			return nil
		}
		regs[i] = newRegistrar(g.n, rk)
		subs[i], err = resource.NewSubAllocator(rk.vmm, &resource.SubAllocatorOptions{GrowSize: size, Segments: regs[i].hooks()})
		if err != nil {
			return err
		}
		// A block taken and freed, then given back by Trim: registered,
		// then deregistered.
		scratch, err := subs[i].Allocate(size, rk.s)
		if err != nil {
			return err
		}
		if err := scratch.Close(); err != nil {
			return err
		}
		before := regs[i].deregistered()
		if err := subs[i].Trim(); err != nil {
			return err
		}
		regs[i].stats.ByTrim = regs[i].deregistered() - before
		if bufs[i].send, err = subs[i].Allocate(size, rk.s); err != nil {
			return err
		}
		if bufs[i].recv, err = subs[i].Allocate(size, rk.s); err != nil {
			return err
		}
	}
	if err := g.measure(ph, bufs, count, iters); err != nil {
		return err
	}
	// Close the sub-allocators with their buffers live: the blocks stay,
	// registered, and Close says how many allocations remain.
	for i, a := range subs {
		before := regs[i].deregistered()
		cerr := a.Close()
		switch {
		case cerr == nil:
			regs[i].problem("SubAllocator.Close with 2 live buffers reported none")
		case !errors.Is(cerr, cuda.ErrorIllegalState):
			return cerr
		}
		regs[i].stats.AtClose = regs[i].deregistered() - before
	}
	// The buffers' Close gives each block back at its last free, and
	// Released deregisters it first.
	for i := range g.ranks {
		before := regs[i].deregistered()
		if err := closeAll(bufs[i : i+1]); err != nil {
			return err
		}
		bufs[i] = pair{}
		regs[i].stats.AfterClose = regs[i].deregistered() - before
		// Failures of those releases are reported by the next Close.
		if err := subs[i].Close(); err != nil {
			return err
		}
	}
	return nil
}

// windowPhase registers NCCLOptions memory as a symmetric window on every
// rank (ncclCommWindowRegister, collective), all-reduces within it, and
// deregisters it (ncclCommWindowDeregister) before the memory is freed.
// Where NCCL is older than 2.27, lacks the calls, refuses the window or
// makes none, the phase is skipped and says why.
func (g *group) windowPhase(ph *Phase, size, count uint64, iters int) (err error) {
	if g.n.version < verWindows {
		ph.Skipped = fmt.Sprintf("NCCL %s has no symmetric-memory windows (2.27 or later)", versionString(g.n.version))
		return nil
	}
	if err := g.n.need("symmetric-memory windows need NCCL 2.27 or later", &g.n.commWindowRegister, &g.n.commWindowDeregister); err != nil {
		ph.Skipped = err.Error()
		return nil
	}
	for _, rk := range g.ranks {
		skip, err := ensureVMM(rk)
		if err != nil {
			return err
		}
		if skip != "" {
			ph.Skipped = skip
			return nil
		}
	}
	// One window per rank holds both buffers, each at the same offset on
	// every rank, as symmetric collectives need.
	half := (size + ncclWinRequiredAlignment - 1) &^ (ncclWinRequiredAlignment - 1)
	whole := make([]*buffer.Buffer, len(g.ranks))
	bufs := make([]pair, len(g.ranks))
	defer func() {
		for _, b := range whole {
			if b != nil {
				err = errors.Join(err, b.Close()) // after the windows' deregistration (deferred below)
			}
		}
	}()
	for i, rk := range g.ranks {
		var err error
		if whole[i], err = rk.vmm.Allocate(2*half, rk.s); err != nil {
			return err
		}
		if bufs[i].send, err = whole[i].Slice(0, size); err != nil {
			return err
		}
		if bufs[i].recv, err = whole[i].Slice(half, size); err != nil {
			return err
		}
	}
	// NCCL writes each ncclWindow_t at ncclGroupEnd when several ranks
	// register in one group: Go heap memory, which does not move, kept
	// alive until then.
	wins := make([]uintptr, len(g.ranks))
	rerr := g.grouped(func(i int, rk *rank) error {
		r, cerr := rk.winRegister.Call(rk.comm, uintptr(whole[i].Ptr()), uintptr(2*half), uintptr(unsafe.Pointer(&wins[i])), ncclWinCollSymmetric)
		return g.n.check("ncclCommWindowRegister", r, cerr)
	})
	runtime.KeepAlive(wins)
	defer func() {
		for i, rk := range g.ranks {
			if wins[i] != 0 {
				r, cerr := rk.winDeregister.Call(rk.comm, wins[i])
				err = errors.Join(err, g.n.check("ncclCommWindowDeregister", r, cerr))
			}
		}
	}()
	if rerr != nil {
		ph.Skipped = "NCCL refused the window: " + rerr.Error()
		return nil
	}
	for i, w := range wins {
		if w == 0 {
			ph.Skipped = fmt.Sprintf("ncclCommWindowRegister made no window on rank %d (NCCL makes none when the communicator has no symmetric-memory support and local registration is off)", g.ranks[i].id)
			return nil
		}
	}
	return g.measure(ph, bufs, count, iters)
}
