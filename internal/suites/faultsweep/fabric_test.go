//go:build cudamemfault && linux

package faultsweep

import (
	"errors"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/ipc"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/virtual"
)

// TestFaultSweepFabric: fabric export and import of VMM allocations and
// of pools, and NCCLOptions, with each driver call failing in turn. On the
// fake driver fabric handles are switched on; on a GPU without IMEX the
// setup reports cuda.ErrNotSupported and the cases skip.
func TestFaultSweepFabric(t *testing.T) {
	if fake != nil {
		old := fake.SetFabric(fakecuda.FabricWorks)
		t.Cleanup(func() { fake.SetFabric(old) })
	}
	fabric := func() *virtual.Options { return &virtual.Options{HandleType: virtual.HandleFabric} }
	cases := []sweepCase{
		{name: "virtual ExportFabric", setup: func() (*fixture, error) {
			f, err := newVMM(fabric(), 2)
			if err != nil {
				return nil, err
			}
			return &fixture{
				op: func() error { _, err := f.r.ExportFabric(f.b); return err },
				verify: func() error {
					if _, err := f.r.ExportFabric(f.b); err != nil {
						return err
					}
					return check(f.b, f.s, f.want)
				},
				cleanup: func() error { return f.cl.run() },
			}, nil
		}},
		{name: "virtual ImportFabric", setup: func() (*fixture, error) {
			f, err := newVMM(fabric(), 2)
			if err != nil {
				return nil, err
			}
			chunks, err := f.r.ExportFabric(f.b)
			if err != nil {
				return nil, joinSetup(err, f.cl)
			}
			var ib *buffer.Buffer
			return &fixture{
				op: func() (err error) { ib, err = f.r.ImportFabric(chunks, f.b.Size()); return err },
				verify: func() error {
					if ib == nil {
						var err error
						if ib, err = f.r.ImportFabric(chunks, f.b.Size()); err != nil {
							return err
						}
					}
					return errors.Join(check(ib, f.s, f.want), check(f.b, f.s, f.want))
				},
				cleanup: func() error { return joinClose(closeBuf(&ib)(), f.cl) },
			}, nil
		}},
		{name: "virtual NCCLOptions", absorbed: map[string]string{"cuMemRelease": "the fabric probe releases its granule again when the first release fails"}, setup: func() (*fixture, error) {
			return &fixture{
				op:      func() error { _, err := virtual.NCCLOptions(dev0()); return err },
				cleanup: func() error { return nil },
			}, nil
		}},
		{name: "cuda CreateMemPool fabric host NUMA", absorbed: map[string]string{"cuMemRelease": "the fabric probe releases its granule again when the first release fails"}, setup: func() (*fixture, error) {
			// The pool's location is probed as itself before the pool is
			// made; a failure anywhere leaves no pool and no probe granule.
			loc := cuda.MemLocation{Type: cuda.MemLocationTypeHostNUMA}
			if err := dev0().CheckFabricAt(loc); err != nil {
				return nil, err
			}
			var pool cuda.MemPool
			return &fixture{
				op: func() (err error) {
					pool, err = dev0().CreateMemPool(&cuda.MemPoolProps{AllocType: cuda.MemAllocationTypePinned, HandleTypes: cuda.MemHandleTypeFabric, Location: loc})
					return err
				},
				cleanup: func() error {
					if pool.IsZero() {
						return nil
					}
					err := pool.Destroy()
					pool = cuda.MemPool{}
					return err
				},
			}, nil
		}},
		{name: "ipc ImportPoolFabric", setup: func() (*fixture, error) {
			pool, err := resource.NewDevicePool(dev0(), &resource.DevicePoolOptions{Fabric: true})
			if err != nil {
				return nil, err
			}
			var cl closers
			cl.add(pool.Close)
			h, err := ipc.ExportPoolFabric(pool)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			var imp *ipc.ImportedPool
			return &fixture{
				op: func() (err error) { imp, err = ipc.ImportPoolFabric(dev0(), h); return err },
				verify: func() error {
					if imp == nil {
						var err error
						if imp, err = ipc.ImportPoolFabric(dev0(), h); err != nil {
							return err
						}
					}
					return nil
				},
				cleanup: func() error {
					var err error
					if imp != nil {
						err = imp.Close()
						imp = nil
					}
					return joinClose(err, cl)
				},
			}, nil
		}},
	}
	sweepAll(t, cases)
}
