package virtual

import (
	"errors"
	"fmt"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// SetPeerAccess sets the given devices' access to b's memory (NoAccess
// revokes it). The setting also applies to memory a later Grow adds. On
// error the previous access is put back. A buffer closed meanwhile gives
// an error matching cuda.ErrClosed; one that a Grow or Shrink is
// consuming is refused.
func (r *Resource) SetPeerAccess(b *buffer.Buffer, access Access, peers ...*cuda.Device) error {
	const op = "Resource.SetPeerAccess"
	a, _, _, err := r.take(op, b)
	if err != nil {
		return err
	}
	f, err := access.flags()
	if err != nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%v", err)
	}
	if err := checkPeers(op, "peer", r.dev, peers); err != nil {
		return err
	}
	descs := make([]cuda.MemAccessDesc, 0, len(peers))
	for _, p := range peers {
		if f != cuda.MemAccessProtNone {
			ok, err := r.drv.peerCanAccess(p)
			if err != nil {
				return fmt.Errorf("%s: %w", op, err)
			}
			if !ok && r.opts.Location == OnDevice {
				return cuda.Errorf(op, cuda.ErrInvalidArgument, "%v cannot access %v's memory", p, r.dev)
			}
		}
		descs = append(descs, cuda.MemAccessDesc{Location: devLoc(p), Flags: f})
	}
	if len(descs) == 0 {
		return nil
	}
	// useLive refuses a claimed allocation: a Grow prepares its new
	// memory with the access recorded now, and a change meanwhile would
	// miss that memory.
	return r.useLive(op, b, a, func() error { return r.setAccess(op, a, descs) })
}

// setAccess sets descs on all of a's memory, or puts the previous access
// back on error. Called with r.mu held and a live.
func (r *Resource) setAccess(op string, a *allocation, descs []cuda.MemAccessDesc) error {
	if err := r.drv.MemSetAccess(a.base, a.mapped, descs...); err != nil {
		err = fmt.Errorf("%s %#x: %w", op, uint64(a.base), err)
		// The driver may have changed part of the range: put the recorded
		// access back, so the allocation is as it was.
		prev := make([]cuda.MemAccessDesc, len(descs))
		for i, d := range descs {
			prev[i] = cuda.MemAccessDesc{Location: d.Location, Flags: a.flagsFor(d.Location)}
		}
		if rerr := r.drv.MemSetAccess(a.base, a.mapped, prev...); rerr != nil {
			err = errors.Join(err, fmt.Errorf("putting the previous access back: %w", rerr))
		}
		return err
	}
	for _, d := range descs {
		a.setDesc(d)
	}
	return nil
}

// flagsFor is the access recorded for loc (none if never granted).
func (a *allocation) flagsFor(loc cuda.MemLocation) cuda.MemAccessFlags {
	for _, d := range a.descs {
		if d.Location == loc {
			return d.Flags
		}
	}
	return cuda.MemAccessProtNone
}

// setDesc records d, replacing any earlier entry for its location.
func (a *allocation) setDesc(d cuda.MemAccessDesc) {
	descs := append([]cuda.MemAccessDesc(nil), a.descs...) // chunks may share the old slice
	for i := range descs {
		if descs[i].Location == d.Location {
			descs[i] = d
			a.descs = descs
			return
		}
	}
	a.descs = append(descs, d)
}

// Access reports how dev may access b's memory.
func (r *Resource) Access(b *buffer.Buffer, dev *cuda.Device) (Access, error) {
	const op = "Resource.Access"
	var f cuda.MemAccessFlags
	err := r.withLive(op, b, func(a *allocation) error { // a.base changes when a grow moves it
		if dev == nil {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil device")
		}
		var err error
		if f, err = r.drv.MemGetAccess(a.base, devLoc(dev)); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
		return nil
	})
	if err != nil {
		return NoAccess, err
	}
	for acc, af := range accessFlags {
		if af == f {
			return Access(acc), nil
		}
	}
	return NoAccess, nil
}
