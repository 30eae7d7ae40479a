package resource

import (
	"context"

	"github.com/cudamem/cudamem/cuda"
)

// closeContext waits, until ctx ends, for the work submitted to the pool's
// device so far (Device.SyncContext: no goroutine or thread per wait),
// then closes. Close itself waits for the device before it destroys an
// owned pool, and that wait cannot be cut short; after this one it finds
// only what was submitted since.
func (c *poolCore) closeContext(ctx context.Context) error {
	if c == nil {
		return nil
	}
	op := c.kind + ".CloseContext"
	if ctx == nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil context (use context.Background())")
	}
	if !c.initialized() {
		return nil // as Close: nothing to close
	}
	if err := c.dev.SyncContext(ctx); err != nil {
		return &cuda.OpError{Op: op, Err: err} // still open: call again, or Close
	}
	return c.close()
}

// CloseContext is Close that gives up waiting when ctx ends: it first
// waits for the work submitted to the pool's device so far, and returns
// an error wrapping ctx's (context.Canceled, context.DeadlineExceeded)
// with the pool still open if ctx ends first. Then it closes as Close
// does (an owned pool is destroyed once no buffer from it is live).
func (p *DevicePool) CloseContext(ctx context.Context) error {
	return p.base().closeContext(ctx)
}

// CloseContext is Close that gives up waiting when ctx ends, as
// DevicePool.CloseContext.
func (p *PinnedPool) CloseContext(ctx context.Context) error {
	return p.base().closeContext(ctx)
}

// preWait waits, until ctx ends, for the streams whose frees a holds (nil:
// the upstream device's legacy default stream). It is only a head start
// for Trim and Close, which make the authoritative waits and report their
// failures: other errors here (a stream closed since, say) are theirs to
// meet, and only the end of ctx stops it.
func (a *SubAllocator) preWait(ctx context.Context, op string) error {
	if ctx == nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil context (use context.Background())")
	}
	if err := ctx.Err(); err != nil {
		return &cuda.OpError{Op: op, Err: err}
	}
	a.mu.Lock()
	streams := make([]*cuda.Stream, 0, len(a.lists))
	for s := range a.lists {
		streams = append(streams, s)
	}
	a.mu.Unlock()
	for _, s := range streams {
		if s == nil {
			d, err := cuda.GetDevice(a.DeviceID())
			if err != nil {
				continue
			}
			s = d.DefaultStream()
		}
		if err := s.SyncContext(ctx); err != nil && ctx.Err() != nil {
			return &cuda.OpError{Op: op, Err: err}
		}
	}
	return nil
}

// CloseContext is Close that gives up waiting when ctx ends: it first
// waits for the streams of the frees the sub-allocator holds, and if ctx
// ends first returns an error wrapping ctx's (context.Canceled,
// context.DeadlineExceeded) with the sub-allocator still open. Then it
// closes as Close does, whose own waits find only what was submitted
// since.
func (a *SubAllocator) CloseContext(ctx context.Context) error {
	const op = "SubAllocator.CloseContext"
	if a == nil || a.up == nil {
		return nil // as Close
	}
	if err := a.preWait(ctx, op); err != nil {
		return err
	}
	return a.Close()
}

// TrimContext is Trim that gives up waiting when ctx ends, as CloseContext
// is Close: nothing is given back if ctx ends during the first wait.
func (a *SubAllocator) TrimContext(ctx context.Context) error {
	const op = "SubAllocator.TrimContext"
	if err := a.check("TrimContext"); err != nil {
		return err
	}
	if err := a.preWait(ctx, op); err != nil {
		return err
	}
	return a.Trim()
}
