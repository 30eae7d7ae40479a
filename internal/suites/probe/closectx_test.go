//go:build linux

package probe

import (
	"context"
	"errors"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// CloseContext with an ended context leaves the pool open and usable;
// with a live one it closes; on nil and zero values it does what Close
// does, or refuses a nil context.
func TestPoolCloseContext(t *testing.T) {
	d := dev(t, 0)
	type pool interface {
		Allocate(uint64, *cuda.Stream) (*buffer.Buffer, error)
		Close() error
		CloseContext(context.Context) error
	}
	for name, mk := range map[string]func() (pool, error){
		"DevicePool": func() (pool, error) {
			return resource.NewDevicePool(d, nil)
		},
		"PinnedPool": func() (pool, error) {
			return resource.NewPinnedPool(nil)
		},
	} {
		t.Run(name, func(t *testing.T) {
			p, err := mk()
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			err = p.CloseContext(ctx)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("CloseContext(cancelled) = %v, want context.Canceled", err)
			}
			b, err := p.Allocate(4096, nil)
			if err != nil {
				t.Fatalf("Allocate after a cancelled CloseContext: %v (the pool must stay open)", err)
			}
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			//lint:ignore SA1012 a nil context is the input under test
			if err := p.CloseContext(nil); !errors.Is(err, cuda.ErrInvalidArgument) { //nolint:staticcheck
				t.Errorf("CloseContext(nil) = %v, want ErrInvalidArgument", err)
			}
			if err := p.CloseContext(context.Background()); err != nil {
				t.Fatal(err)
			}
			if _, err := p.Allocate(4096, nil); !errors.Is(err, cuda.ErrClosed) {
				t.Errorf("Allocate after CloseContext = %v, want ErrClosed", err)
			}
			if err := p.CloseContext(context.Background()); err != nil {
				t.Errorf("second CloseContext: %v (idempotent, as Close)", err)
			}
		})
	}
	var nilPool *resource.DevicePool
	if err := nilPool.CloseContext(context.Background()); err != nil {
		t.Errorf("nil DevicePool: %v", err)
	}
	if err := new(resource.DevicePool).CloseContext(context.Background()); err != nil {
		t.Errorf("zero DevicePool: %v", err)
	}
}
