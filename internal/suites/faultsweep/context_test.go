//go:build cudamemfault

package faultsweep

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cudamem/cudamem/cuda"
)

// idAbsorbed: the context ID is read best-effort (WrapContext tells reused
// handles apart with it; without it, by the handle alone).
var idAbsorbed = map[string]string{"cuCtxGetId": "the context ID is best-effort"}

// TestFaultSweepContexts: Device.NewContext, Context.Close, WrapContext and
// Device.WrapStream with each driver call failing: no context or stream is
// left behind, and a failed Close leaves the context usable.
func TestFaultSweepContexts(t *testing.T) {
	var made *cuda.Context
	closeMade := func() error {
		err := made.Close()
		made = nil
		return err
	}
	// usable makes and syncs a stream in the context's view.
	usable := func(v *cuda.Device) error {
		s, err := v.NewStream()
		if err != nil {
			return err
		}
		return errors.Join(s.Sync(), s.Close())
	}
	cases := []sweepCase{
		{name: "Device.NewContext", absorbed: idAbsorbed, setup: func() (*fixture, error) {
			return &fixture{
				op: func() (err error) { made, err = dev0().NewContext(0); return err },
				verify: func() error {
					if made == nil {
						return nil
					}
					return usable(made.Device())
				},
				cleanup: closeMade,
			}, nil
		}},
		{name: "Device.NewGreenContext", absorbed: idAbsorbed, driverKeeps: greenKeeps, setup: func() (*fixture, error) {
			return &fixture{
				op: func() (err error) { made, err = dev0().NewGreenContext(8); return err },
				verify: func() error {
					if made == nil {
						return nil
					}
					return usable(made.Device())
				},
				cleanup: closeMade,
			}, nil
		}},
		{name: "Context.Close", setup: func() (*fixture, error) {
			c, err := dev0().NewContext(0)
			if err != nil {
				return nil, err
			}
			return &fixture{
				op: c.Close,
				verify: func() error {
					if c.IsClosed() {
						return nil
					}
					return usable(c.Device())
				},
				cleanup: c.Close,
			}, nil
		}},
		{name: "Context.Close green", driverKeeps: greenKeeps, setup: func() (*fixture, error) {
			c, err := dev0().NewGreenContext(8)
			if err != nil {
				return nil, err
			}
			return &fixture{
				op: c.Close,
				verify: func() error {
					if c.IsClosed() {
						return nil
					}
					return usable(c.Device())
				},
				cleanup: c.Close,
			}, nil
		}},
		{name: "WrapContext", absorbed: idAbsorbed, setup: func() (*fixture, error) {
			c, err := dev0().NewContext(0)
			if err != nil {
				return nil, err
			}
			h := c.Handle()
			return &fixture{
				op: func() error {
					v, err := cuda.WrapContext(h)
					if err == nil && v != c.Device() {
						return fmt.Errorf("WrapContext found another view")
					}
					return err
				},
				verify:  func() error { return usable(c.Device()) },
				cleanup: c.Close,
			}, nil
		}},
		{name: "Device.WrapStream", setup: func() (*fixture, error) {
			c, err := dev0().NewContext(0)
			if err != nil {
				return nil, err
			}
			s, err := c.Device().NewStream()
			if err != nil {
				return nil, errors.Join(err, c.Close())
			}
			return &fixture{
				op: func() error {
					w, err := c.Device().WrapStream(s.Handle())
					if err != nil {
						return err
					}
					return w.Close()
				},
				verify:  s.Sync,
				cleanup: func() error { return errors.Join(s.Close(), c.Close()) },
			}, nil
		}},
	}
	sweepAll(t, cases)
}

// greenKeeps: on an H200 with driver 580, free device memory fell by 4 MiB
// with every green context made and destroyed, also in the unarmed run
// (k = 0) whose every call succeeded and whose context cuGreenCtxDestroy
// destroyed. The driver's calls alone lose the same (32 MiB for 8 pairs,
// as NewGreenContext and Close do: cuda's TestGreenContextDriverMemory),
// so it is memory the driver keeps; the fake driver's counters, checked
// in CPU runs, stay at zero.
const greenKeeps = "the driver keeps 4 MiB per green context made and destroyed"
