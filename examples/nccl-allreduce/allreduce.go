package main

import (
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/loader"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/virtual"
)

// Result is what one process measured, for its ranks.
type Result struct {
	Ranks       int   // ranks in the communicator, over every process
	Local       []int // the ranks this process drove
	GPUs        []int // their devices' ordinals
	Bytes       uint64
	NCCLVersion int
	Library     string
	Phases      []Phase
	Segments    SegmentStats // the registered phase's hooks, summed over Local
}

// Phase is one all-reduce run: on which memory, how fast, or why it did
// not run.
type Phase struct {
	Name   string        // "pool", "registered", "window"
	Memory string        // what the buffers were
	Time   time.Duration // per allreduce (mean over iters)
	AlgBW  float64       // GB/s
	BusBW  float64       // GB/s
	// Skipped says why the phase did not run ("" when it ran: then every
	// element of every local rank's result was checked, before and after
	// the timed loop).
	Skipped string
}

// Ran reports whether the phase ran (and its data was checked).
func (p Phase) Ran() bool { return p.Skipped == "" }

// Phase returns the phase called name (the zero Phase if none).
func (r Result) Phase(name string) Phase {
	for _, p := range r.Phases {
		if p.Name == name {
			return p
		}
	}
	return Phase{}
}

// rank is one GPU's part in this process: its communicator and stream,
// and NCCL's calls bound to its device (Device.Foreign makes the device's
// primary context current inside each call, so NCCL's cudaGetDevice finds
// that device).
type rank struct {
	id   int // the global rank
	dev  *cuda.Device
	comm uintptr
	s    *cuda.Stream
	vmm  *virtual.Resource // NCCLOptions memory, made by the registered phase

	allReduce, register, deregister, winRegister, winDeregister *cuda.ForeignFunc
}

// group is the ranks this process drives: every local GPU in the
// single-process mode, one in the multi-process mode.
type group struct {
	n      *nccl
	nranks int // ranks in the communicator, over every process
	ranks  []*rank
}

// newRank binds NCCL's calls to dev and makes the rank's stream.
func (g *group) newRank(id int, dev *cuda.Device, comm uintptr) (*rank, error) {
	rk := &rank{id: id, dev: dev, comm: comm}
	var err error
	if rk.allReduce, err = dev.Foreign(g.n.allReduce); err != nil {
		return nil, err
	}
	for _, o := range []struct {
		dst **cuda.ForeignFunc
		p   *loader.Proc
	}{
		{&rk.register, &g.n.commRegister}, {&rk.deregister, &g.n.commDeregister},
		{&rk.winRegister, &g.n.commWindowRegister}, {&rk.winDeregister, &g.n.commWindowDeregister},
	} {
		if o.p.Found() { // unresolved: stays nil, and nccl.need says so
			if *o.dst, err = dev.Foreign(*o.p); err != nil {
				return nil, err
			}
		}
	}
	if rk.s, err = dev.NewStream(); err != nil {
		return nil, err
	}
	return rk, nil
}

// close waits for the rank's stream and destroys it (not the
// communicator: the caller destroys those, after every rank's memory is
// deregistered).
func (rk *rank) close() error {
	if rk == nil || rk.s == nil {
		return nil
	}
	return errors.Join(rk.s.Sync(), rk.s.Close())
}

// grouped calls fn for each local rank, between ncclGroupStart and
// ncclGroupEnd when there are several (a collective over communicators of
// one process must be issued as a group, or the first call waits for
// ranks never reached). Group calls keep per-thread state: one OS thread
// from start to end.
func (g *group) grouped(fn func(i int, rk *rank) error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	many := len(g.ranks) > 1
	if many {
		if err := g.n.check("ncclGroupStart", g.n.groupStart.Call(), nil); err != nil {
			return err
		}
	}
	var first error
	for i, rk := range g.ranks {
		if err := fn(i, rk); err != nil && first == nil {
			first = err
		}
	}
	if many {
		if err := g.n.check("ncclGroupEnd", g.n.groupEnd.Call(), nil); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// pair is one local rank's buffers for a phase.
type pair struct{ send, recv *buffer.Buffer }

// measure all-reduces each rank's send into its recv: once, checked; iters
// times, timed; checked again.
func (g *group) measure(ph *Phase, bufs []pair, count uint64, iters int) error {
	for i, rk := range g.ranks {
		in := make([]float32, count)
		for j := range in {
			in[j] = float32(rk.id+1) + float32(j%7) // rank- and element-dependent
		}
		if err := buffer.CopyFromHost(bufs[i].send, in, rk.s); err != nil {
			return err
		}
		// NaN everywhere: a result NCCL did not write cannot pass.
		if err := bufs[i].recv.Fill32(0xffffffff, rk.s); err != nil {
			return err
		}
	}
	once := func() error {
		return g.grouped(func(i int, rk *rank) error {
			r, err := rk.allReduce.Call(uintptr(bufs[i].send.Ptr()), uintptr(bufs[i].recv.Ptr()), uintptr(count), ncclFloat32, ncclSum, rk.comm, rk.s.Handle())
			return g.n.check("ncclAllReduce", r, err)
		})
	}
	if err := once(); err != nil { // warm-up, and the result checked below
		return err
	}
	if err := g.sync(); err != nil {
		return err
	}
	if err := g.check(ph.Name, bufs, count); err != nil {
		return err
	}
	start := time.Now()
	for range iters {
		if err := once(); err != nil {
			return err
		}
	}
	if err := g.sync(); err != nil {
		return err
	}
	ph.Time = time.Since(start) / time.Duration(iters)
	ph.AlgBW = float64(count*4) / ph.Time.Seconds() / 1e9
	ph.BusBW = ph.AlgBW * 2 * float64(g.nranks-1) / float64(g.nranks)
	return g.check(ph.Name, bufs, count)
}

func (g *group) sync() error {
	for _, rk := range g.ranks {
		if err := rk.s.Sync(); err != nil {
			return err
		}
	}
	return nil
}

// check reads every local rank's result back: element j is the sum over
// all ranks r of (r+1) + j%7.
func (g *group) check(phase string, bufs []pair, count uint64) error {
	n := g.nranks
	got := make([]float32, count)
	for i, rk := range g.ranks {
		if err := buffer.CopyToHost(got, bufs[i].recv, rk.s); err != nil {
			return err
		}
		for j, v := range got {
			want := float32(n*(n+1)/2) + float32(n)*float32(j%7)
			if v != want {
				return fmt.Errorf("%s: rank %d (%v), element %d: got %v, want %v", phase, rk.id, rk.dev, j, v, want)
			}
		}
	}
	return nil
}

// closeAll closes every buffer of bufs (nil ones skipped).
func closeAll(bufs []pair) error {
	var errs []error
	for _, p := range bufs {
		for _, b := range []*buffer.Buffer{p.send, p.recv} {
			if b != nil {
				errs = append(errs, b.Close())
			}
		}
	}
	return errors.Join(errs...)
}

// phases runs the three phases on the group's ranks: the device's pool,
// sub-allocated NCCLOptions memory registered through segment hooks, and
// symmetric windows. A phase NCCL or the device cannot run is skipped,
// saying why; one that runs must give the right sums.
func (g *group) phases(res *Result, size uint64, iters int) error {
	count := size / 4

	pool := Phase{Name: "pool", Memory: "resource.DevicePool (the device's pool)"}
	if err := g.poolPhase(&pool, size, count, iters); err != nil {
		return err
	}
	res.Phases = append(res.Phases, pool)

	reg := Phase{Name: "registered", Memory: "SubAllocator over virtual.NCCLOptions memory, blocks ncclCommRegister'ed by SegmentHooks"}
	if err := g.registeredPhase(&reg, &res.Segments, size, count, iters); err != nil {
		return err
	}
	res.Phases = append(res.Phases, reg)

	win := Phase{Name: "window", Memory: "virtual.NCCLOptions memory in an ncclCommWindowRegister window (NCCL_WIN_COLL_SYMMETRIC)"}
	if err := g.windowPhase(&win, size, count, iters); err != nil {
		return err
	}
	res.Phases = append(res.Phases, win)
	return nil
}

func (g *group) poolPhase(ph *Phase, size, count uint64, iters int) (err error) {
	bufs := make([]pair, len(g.ranks))
	defer func() { err = errors.Join(err, closeAll(bufs)) }()
	for i, rk := range g.ranks {
		pool, err := resource.NewDevicePool(rk.dev, nil) // the device's own pool
		if err != nil {
			return err
		}
		if bufs[i].send, err = pool.Allocate(size, rk.s); err != nil {
			return err
		}
		if bufs[i].recv, err = pool.Allocate(size, rk.s); err != nil {
			return err
		}
	}
	return g.measure(ph, bufs, count, iters)
}
