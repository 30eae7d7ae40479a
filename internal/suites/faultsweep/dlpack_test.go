//go:build cudamemfault && linux && (amd64 || arm64)

package faultsweep

import (
	"testing"
	"unsafe"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/buffer/dlpack"
	"github.com/cudamem/cudamem/resource"
)

// TestFaultSweepDLPackImport imports an exported device tensor with each
// of Import's driver calls (the pointer queries that vouch for CUDA
// memory) failing: a failed Import takes nothing, the tensor stays the
// caller's, and Delete then gives it back.
func TestFaultSweepDLPackImport(t *testing.T) {
	sweep(t, sweepCase{name: "dlpack.Import", absorbed: queryPointerAbsorbed, setup: func() (*fixture, error) {
		var cl closers
		d, err := device(0)
		if err != nil {
			return nil, err
		}
		pool, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{MaxSize: 64 << 20})
		if err != nil {
			return nil, err
		}
		cl.add(pool.Close)
		b, err := pool.Allocate(1<<20, nil)
		if err != nil {
			return nil, joinSetup(err, cl)
		}
		cl.add(b.Close)
		v, err := dlpack.Export(b)
		if err != nil {
			return nil, joinSetup(err, cl)
		}
		p := uintptr(unsafe.Pointer(v))
		var in *buffer.Buffer
		return &fixture{
			op: func() error {
				var err error
				in, err = dlpack.Import(p, dlpack.ExpectDevice(dlpack.Device{Type: dlpack.CUDA}))
				return err
			},
			cleanup: func() error {
				if in != nil {
					if err := in.Close(); err != nil { // runs the deleter
						return err
					}
				} else if err := dlpack.Delete(p); err != nil {
					return err
				}
				return cl.run()
			},
			state: func() string {
				if dlpack.Live() != 1 {
					return "the export was released"
				}
				return "one export live"
			},
		}, nil
	}})
}
