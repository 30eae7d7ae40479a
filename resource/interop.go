package resource

import (
	"fmt"

	"github.com/cudamem/cudamem/cuda"
)

// poolErr is Pool with an error: cuda.ErrClosed once closed,
// cuda.ErrInvalidArgument for a pool not made by a constructor.
func (c *poolCore) poolErr(kind string) (cuda.MemPool, error) {
	op := kind + ".PoolErr"
	switch {
	case c == nil:
		return cuda.MemPool{}, errNil(kind, "PoolErr")
	case !c.initialized():
		return cuda.MemPool{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "zero %s (use its constructor)", kind)
	case c.life.IsClosed():
		return cuda.MemPool{}, &cuda.OpError{Op: op, Err: fmt.Errorf("%w: pool %#x", cuda.ErrClosed, c.pool.Handle())}
	}
	return c.pool, nil
}

// PoolErr is Pool with an error: the driver pool, or an error matching
// cuda.ErrClosed once p is closed (cuda.ErrInvalidArgument for a nil or
// zero pool), where Pool returns the zero MemPool. The handle is valid
// only while p stays open; to keep it open for the length of a foreign
// call, use Use.
func (p *DevicePool) PoolErr() (cuda.MemPool, error) {
	return p.base().poolErr("DevicePool")
}

// PoolErr is Pool with an error (see DevicePool.PoolErr).
func (p *PinnedPool) PoolErr() (cuda.MemPool, error) {
	return p.base().poolErr("PinnedPool")
}
