// Package staging holds the tuning knobs and the counters of package
// buffer's staged copies between ordinary Go memory and a device (see
// buffer's staging.go). Nothing in the public API sets them: the bench
// command sweeps them to measure which settings the defaults should be,
// and reads the counters to say where a copy's time goes.
package staging

import (
	"fmt"
	"sync/atomic"
)

// Prefault says how a copy from a device into Go memory gets the
// destination's pages mapped before its workers write them. A fresh
// slice's pages are mapped by the kernel on first write, one fault per
// page; faulting them in while the DMA of the same piece still runs takes
// that work off the copy's critical path.
type Prefault int

const (
	// PrefaultOff leaves the faults to the copy itself.
	PrefaultOff Prefault = iota
	// PrefaultTouch writes one byte of every page of a worker's share of
	// the next piece before that piece's DMA lands.
	PrefaultTouch
	// PrefaultPopulate asks the kernel to map the share's pages in one
	// call (madvise MADV_POPULATE_WRITE, Linux 5.14 and later), falling
	// back to PrefaultTouch where the kernel refuses.
	PrefaultPopulate
)

var prefaultNames = [...]string{"off", "touch", "populate"}

func (p Prefault) String() string {
	if p >= 0 && int(p) < len(prefaultNames) {
		return prefaultNames[p]
	}
	return fmt.Sprintf("Prefault(%d)", int(p))
}

// ParsePrefault reads a Prefault's name.
func ParsePrefault(s string) (Prefault, error) {
	for i, n := range prefaultNames {
		if s == n {
			return Prefault(i), nil
		}
	}
	return 0, fmt.Errorf("unknown prefault mode %q (want off, touch or populate)", s)
}

// Params are the staging parameters.
type Params struct {
	// MinBytes and OutMinBytes are the smallest copies staged into a
	// device and out of one; smaller ones take the driver's own path.
	MinBytes, OutMinBytes int
	// FreshMinBytes is the smallest copy out of a device staged when its
	// destination is fresh (pages the kernel has not mapped yet): the
	// driver's own copy faults them in page by page, so staging pays
	// from smaller sizes there.
	FreshMinBytes int
	// ChunkSize and Chunks are the pinned pool's shape: Chunks chunks of
	// ChunkSize bytes, which is also how many DMAs one copy keeps queued.
	ChunkSize, Chunks int
	// InWorkers and OutWorkers are the goroutines that move bytes
	// between the Go slice and the chunks, for copies into a device and
	// out of one (capped by GOMAXPROCS).
	InWorkers, OutWorkers int
	// FreshWorkers, when above 0, are the workers of a copy out of a
	// device into fresh memory (pages the kernel has not mapped yet, as
	// in a new slice): there the kernel's mapping of every page is the
	// work, and it scales with the goroutines that fault, where a copy
	// into mapped memory is bound by the memory's bandwidth.
	FreshWorkers int
	// Prefault is how a copy out of a device maps the destination's pages.
	Prefault Prefault
	// HugePages asks the kernel (madvise MADV_HUGEPAGE) to back the
	// destination of a copy out of a device with huge pages where it
	// can: one fault per 2 MiB rather than per page.
	HugePages bool
	// Eager queues a chunk's next DMA as soon as the workers have
	// emptied it, rather than after the DMA before it has landed.
	Eager bool
	// Ahead is how many goroutines of their own map a copy's
	// destination pages ahead of the copying workers, piece by piece
	// (with PrefaultPopulate only: the kernel maps pages without
	// changing their bytes, whatever the order); 0: the copying
	// workers map their own shares (Prefault).
	Ahead int
}

func (p Params) String() string {
	s := fmt.Sprintf("min=%s/%s/%s chunks=%dx%s in=%d out=%d prefault=%v eager=%v", size(p.MinBytes), size(p.OutMinBytes), size(p.FreshMinBytes), p.Chunks, size(p.ChunkSize), p.InWorkers, p.OutWorkers, p.Prefault, p.Eager)
	if p.FreshWorkers > 0 {
		s += fmt.Sprintf(" fresh=%d", p.FreshWorkers)
	}
	if p.HugePages {
		s += " hugepages"
	}
	if p.Ahead > 0 {
		s += fmt.Sprintf(" ahead=%d", p.Ahead)
	}
	return s
}

// Check reports what is wrong with p, or nil.
func (p Params) Check() error {
	switch {
	case p.MinBytes < 0 || p.OutMinBytes < 0 || p.FreshMinBytes < 0:
		return fmt.Errorf("staging: MinBytes %d, OutMinBytes %d or FreshMinBytes %d is negative", p.MinBytes, p.OutMinBytes, p.FreshMinBytes)
	case p.ChunkSize < 64<<10 || p.ChunkSize > 1<<30 || p.ChunkSize%(64<<10) != 0:
		return fmt.Errorf("staging: ChunkSize %d is not a multiple of 64 KiB between 64 KiB and 1 GiB", p.ChunkSize)
	case p.Chunks < 1 || p.Chunks > 64:
		return fmt.Errorf("staging: Chunks %d is not between 1 and 64", p.Chunks)
	case p.InWorkers < 1 || p.InWorkers > 256 || p.OutWorkers < 1 || p.OutWorkers > 256:
		return fmt.Errorf("staging: workers %d (in), %d (out) not between 1 and 256", p.InWorkers, p.OutWorkers)
	case p.FreshWorkers < 0 || p.FreshWorkers > 256:
		return fmt.Errorf("staging: FreshWorkers %d not between 0 and 256", p.FreshWorkers)
	case p.Prefault < PrefaultOff || p.Prefault > PrefaultPopulate:
		return fmt.Errorf("staging: unknown prefault mode %d", int(p.Prefault))
	case p.Ahead < 0 || p.Ahead > 256:
		return fmt.Errorf("staging: Ahead %d not between 0 and 256", p.Ahead)
	case p.Ahead > 0 && p.Prefault != PrefaultPopulate:
		return fmt.Errorf("staging: Ahead %d needs PrefaultPopulate (touching pages ahead would race with the copy), not %v", p.Ahead, p.Prefault)
	}
	return nil
}

func size(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// The hooks package buffer installs at init.
var (
	get func() Params
	set func(Params) error
)

// Register installs package buffer's accessors; called once, from its init.
func Register(current func() Params, apply func(Params) error) {
	get, set = current, apply
}

// Current returns the parameters in force.
func Current() Params {
	if get == nil {
		return Params{}
	}
	return get()
}

// Set replaces the parameters. It waits for the copy in progress, if any,
// and frees the pinned pool when its shape changes (the next copy
// allocates the new one). It must not be called while copies are being
// measured.
func Set(p Params) error {
	if err := p.Check(); err != nil {
		return err
	}
	if set == nil {
		return fmt.Errorf("staging: package buffer is not linked in")
	}
	return set(p)
}

// Profile turns the counters on; off, the copies pay nothing for them.
var Profile atomic.Bool

// Counters, summed over the staged copies made while Profile is on.
var (
	// Copies is the number of staged copies, Bytes the bytes they moved.
	Copies, Bytes atomic.Int64
	// WaitNs is the time the driving goroutine spent waiting for DMAs
	// to land (copies out of a device) or for chunks to be free.
	WaitNs atomic.Int64
	// MoveNs is the workers' time in memcpy, summed over workers.
	MoveNs atomic.Int64
	// PrefaultNs is the workers' time mapping destination pages ahead.
	PrefaultNs atomic.Int64
	// IdleNs is the workers' time waiting for a piece to be opened.
	IdleNs atomic.Int64
	// Workers sums, over copies, the workers each used (MoveNs divided
	// by it is the time of one worker).
	Workers atomic.Int64
)

// Stats is a snapshot of the counters.
type Stats struct {
	Copies, Bytes, WaitNs, MoveNs, PrefaultNs, IdleNs, Workers int64
}

// Read returns the counters now.
func Read() Stats {
	return Stats{Copies.Load(), Bytes.Load(), WaitNs.Load(), MoveNs.Load(), PrefaultNs.Load(), IdleNs.Load(), Workers.Load()}
}

// Sub returns s less an earlier snapshot.
func (s Stats) Sub(o Stats) Stats {
	return Stats{s.Copies - o.Copies, s.Bytes - o.Bytes, s.WaitNs - o.WaitNs, s.MoveNs - o.MoveNs, s.PrefaultNs - o.PrefaultNs, s.IdleNs - o.IdleNs, s.Workers - o.Workers}
}
