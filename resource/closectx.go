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
	if p == nil {
		return nil
	}
	return p.core.closeContext(ctx)
}

// CloseContext is Close that gives up waiting when ctx ends, as
// DevicePool.CloseContext.
func (p *PinnedPool) CloseContext(ctx context.Context) error {
	if p == nil {
		return nil
	}
	return p.core.closeContext(ctx)
}
