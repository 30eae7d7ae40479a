//go:build cudamemfault && linux

package faultsweep

import (
	"errors"
	"fmt"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/faultinject"
	"github.com/cudamem/cudamem/ipc"
	"github.com/cudamem/cudamem/resource"
)

// ipcFixture is an IPC-enabled pool with one written buffer, exported once
// (the driver keeps a descriptor of its own after a pool's first export),
// and optionally imported back in this process.
type ipcFixture struct {
	cl   closers
	pool *resource.DevicePool
	s    *cuda.Stream
	b    *buffer.Buffer
	want []byte
	h    *ipc.Handle
	imp  *ipc.ImportedPool
	desc ipc.Descriptor
}

const ipcSize = 64 << 10

func newIPC(export, imp bool) (*ipcFixture, error) {
	f := &ipcFixture{}
	var err error
	if f.pool, err = resource.NewDevicePool(dev0(), &resource.DevicePoolOptions{IPC: true, MaxSize: 64 << 20}); err != nil {
		return nil, err
	}
	f.cl.add(f.pool.Close)
	if f.s, err = newStream(&f.cl, 0); err != nil {
		return nil, joinSetup(err, f.cl)
	}
	if f.b, err = f.pool.Allocate(ipcSize, f.s); err != nil {
		return nil, joinSetup(err, f.cl)
	}
	f.cl.add(f.b.Close)
	f.want = pattern(ipcSize, 9)
	if err := write(f.b, f.s, 9); err != nil {
		return nil, joinSetup(err, f.cl)
	}
	warm, err := ipc.ExportPool(f.pool)
	if err != nil {
		return nil, joinSetup(err, f.cl)
	}
	if err := warm.Close(); err != nil {
		return nil, joinSetup(err, f.cl)
	}
	if !export {
		return f, nil
	}
	if f.h, err = ipc.ExportPool(f.pool); err != nil {
		return nil, joinSetup(err, f.cl)
	}
	f.cl.add(f.h.Close)
	if f.desc, err = ipc.ExportBuffer(f.b); err != nil {
		return nil, joinSetup(err, f.cl)
	}
	if !imp {
		return f, nil
	}
	if f.imp, err = ipc.ImportPool(dev0(), f.h); err != nil {
		return nil, joinSetup(err, f.cl)
	}
	f.cl.add(f.imp.Close)
	return f, nil
}

// gpuSameProcess: the real driver may refuse to import, in the process
// that exported it, a pool or allocation it exported (these sweeps need
// both ends in one process); the multi-process IPC tests cover the real
// path.
const gpuSameProcess = "in-process IPC import is a fake-driver sweep: the real driver's same-process import rules differ; package ipc's multi-process tests cover it"

// TestFaultSweepIPC: pool export and import, buffer export and import,
// closing an imported pool, legacy IPC.
func TestFaultSweepIPC(t *testing.T) {
	cases := []sweepCase{
		{name: "ipc.ExportPool", setup: func() (*fixture, error) {
			f, err := newIPC(false, false)
			if err != nil {
				return nil, err
			}
			var h *ipc.Handle
			return &fixture{
				op: func() (err error) { h, err = ipc.ExportPool(f.pool); return err },
				verify: func() error {
					h2, err := ipc.ExportPool(f.pool)
					if err != nil {
						return err
					}
					return h2.Close()
				},
				cleanup: func() error {
					var err error
					if h != nil {
						err = h.Close()
					}
					return joinClose(err, f.cl)
				},
			}, nil
		}},
		{name: "ipc.ExportBuffer", setup: func() (*fixture, error) {
			f, err := newIPC(false, false)
			if err != nil {
				return nil, err
			}
			return &fixture{
				op: func() error { _, err := ipc.ExportBuffer(f.b); return err },
				verify: func() error {
					_, err := ipc.ExportBuffer(f.b)
					return errors.Join(err, check(f.b, f.s, f.want))
				},
				cleanup: func() error { return f.cl.run() },
			}, nil
		}},
		{name: "ipc.ImportPool", gpuSkip: gpuSameProcess, setup: func() (*fixture, error) {
			f, err := newIPC(true, false)
			if err != nil {
				return nil, err
			}
			var p *ipc.ImportedPool
			return &fixture{
				op: func() (err error) { p, err = ipc.ImportPool(dev0(), f.h); return err },
				verify: func() error {
					// Importing works (again, or for the first time) and
					// the imported pool maps the exporter's buffer.
					q, err := ipc.ImportPool(dev0(), f.h)
					if err != nil {
						return err
					}
					if p == nil {
						p = q
					}
					b, err := q.Import(f.desc, f.s)
					if err != nil {
						return err
					}
					return errors.Join(check(b, f.s, f.want), b.Close())
				},
				cleanup: func() error {
					var err error
					if p != nil {
						err = p.Close()
					}
					return joinClose(err, f.cl)
				},
			}, nil
		}},
		{name: "ImportedPool.Import", gpuSkip: gpuSameProcess, absorbed: queryPointerAbsorbed, setup: func() (*fixture, error) {
			f, err := newIPC(true, true)
			if err != nil {
				return nil, err
			}
			var b *buffer.Buffer
			return &fixture{
				op: func() (err error) { b, err = f.imp.Import(f.desc, f.s); return err },
				verify: func() error {
					if b == nil {
						var err error
						if b, err = f.imp.Import(f.desc, f.s); err != nil {
							return err
						}
					}
					return check(b, f.s, f.want)
				},
				cleanup: func() error { return joinClose(closeBuf(&b)(), f.cl) },
			}, nil
		}},
		{name: "ImportedPool imported Buffer.Close", gpuSkip: gpuSameProcess, setup: func() (*fixture, error) {
			f, err := newIPC(true, true)
			if err != nil {
				return nil, err
			}
			b, err := f.imp.Import(f.desc, f.s)
			if err != nil {
				return nil, joinSetup(err, f.cl)
			}
			return &fixture{
				op: b.Close,
				verify: func() error {
					if !b.IsClosed() {
						return check(b, f.s, f.want)
					}
					return check(f.b, f.s, f.want) // the exporter's memory lives on
				},
				cleanup: func() error { return joinClose(b.Close(), f.cl) },
			}, nil
		}},
		{name: "ImportedPool.Close", gpuSkip: gpuSameProcess, setup: func() (*fixture, error) {
			f, err := newIPC(true, true)
			if err != nil {
				return nil, err
			}
			var opErr error
			return &fixture{
				op: func() error { opErr = f.imp.Close(); return opErr },
				// The contract (package ipc, ImportedPool.Close): Close
				// always closes; a destruction that fails (cuCtxSynchronize
				// or cuMemPoolDestroy) leaves the pool closed but not
				// destroyed, still registered, so a re-import is refused
				// with ErrClosed (the driver could hand a second import
				// of the pool the mappings the first still has) until a
				// Close retries the destruction.
				verify: func() error {
					if !f.imp.IsClosed() {
						return errors.New("Close returned with the pool still open")
					}
					if opErr != nil {
						q, err := ipc.ImportPool(dev0(), f.h)
						if err == nil {
							return errors.Join(errors.New("re-import allowed while the failed destruction awaits a retry"), q.Close())
						}
						if !errors.Is(err, cuda.ErrClosed) {
							return fmt.Errorf("re-import before the retry: want ErrClosed, got %w", err)
						}
						if err := f.imp.Close(); err != nil {
							return fmt.Errorf("retrying Close after %v: %w", opErr, err)
						}
					}
					// Destroyed: the pool imports afresh and maps the
					// exporter's buffer.
					q, err := ipc.ImportPool(dev0(), f.h)
					if err != nil {
						return err
					}
					if q == f.imp {
						return errors.Join(errors.New("ImportPool returned the closed pool"), q.Close())
					}
					b, err := q.Import(f.desc, f.s)
					if err != nil {
						return errors.Join(err, q.Close())
					}
					return errors.Join(check(b, f.s, f.want), b.Close(), q.Close())
				},
				cleanup: func() error { return f.cl.run() },
			}, nil
		}},
		{name: "ipc.ExportPool(ImportedPool)", gpuSkip: gpuSameProcess, setup: func() (*fixture, error) {
			f, err := newIPC(true, true)
			if err != nil {
				return nil, err
			}
			var h *ipc.Handle
			return &fixture{
				op: func() (err error) { h, err = ipc.ExportPool(f.imp); return err },
				cleanup: func() error {
					var err error
					if h != nil {
						err = h.Close()
					}
					return joinClose(err, f.cl)
				},
			}, nil
		}},
		{name: "ipc.ExportLegacy", absorbed: queryPointerAbsorbed, setup: func() (*fixture, error) {
			var cl closers
			r, err := resource.NewSyncDevice(dev0())
			if err != nil {
				return nil, err
			}
			s, err := newStream(&cl, 0)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			b, err := r.Allocate(ipcSize, s)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			cl.add(b.Close)
			return &fixture{
				op: func() error { _, err := ipc.ExportLegacy(b); return err },
				verify: func() error {
					_, err := ipc.ExportLegacy(b)
					return errors.Join(err, roundTrip(b, s, 3))
				},
				cleanup: func() error { return cl.run() },
			}, nil
		}},
		{name: "ipc.OpenLegacy", gpuSkip: "a process cannot open its own legacy IPC handles (CUDA rule); package ipc's multi-process tests cover it",
			setup: func() (*fixture, error) {
				var cl closers
				r, err := resource.NewSyncDevice(dev0())
				if err != nil {
					return nil, err
				}
				s, err := newStream(&cl, 0)
				if err != nil {
					return nil, joinSetup(err, cl)
				}
				src, err := r.Allocate(ipcSize, s)
				if err != nil {
					return nil, joinSetup(err, cl)
				}
				cl.add(src.Close)
				if err := write(src, s, 5); err != nil {
					return nil, joinSetup(err, cl)
				}
				lh, err := ipc.ExportLegacy(src)
				if err != nil {
					return nil, joinSetup(err, cl)
				}
				var b *buffer.Buffer
				return &fixture{
					op: func() (err error) { b, err = ipc.OpenLegacy(dev0(), lh); return err },
					verify: func() error {
						if b == nil {
							var err error
							if b, err = ipc.OpenLegacy(dev0(), lh); err != nil {
								return err
							}
						}
						return check(b, s, pattern(ipcSize, 5))
					},
					cleanup: func() error { return joinClose(closeBuf(&b)(), cl) },
				}, nil
			}},
	}
	sweepAll(t, cases)
}

// TestIPCForgedDescriptorsNoDriverCall: through the whole path on the
// fake driver (ExportPool makes the pool key, ExportBuffer seals, the
// Handle carries the key into ImportPool), a descriptor the key does not
// authenticate makes no driver call at all, where the real driver
// crashed on altered export data; the genuine one imports.
func TestIPCForgedDescriptorsNoDriverCall(t *testing.T) {
	if fake == nil {
		t.Skip(gpuSameProcess)
	}
	needDevices(t, 1)
	f, err := newIPC(true, true)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := f.cl.run(); err != nil {
			t.Error(err)
		}
	}()
	if !f.h.HasKey() {
		t.Fatal("ExportPool made a Handle without the pool key")
	}
	forge := map[string]func(d *ipc.Descriptor){
		"export data bit": func(d *ipc.Descriptor) { d.Data.Reserved[9] ^= 0x20 },
		"size":            func(d *ipc.Descriptor) { d.Size = 1 << 40 },
		"MAC":             func(d *ipc.Descriptor) { d.MAC[15] ^= 1 },
	}
	for name, m := range forge {
		d := f.desc
		m(&d)
		faultinject.Reset()
		b, err := f.imp.Import(d, f.s)
		calls := faultinject.Calls()
		if err == nil {
			_ = b.Close()
			t.Fatalf("%s: forged descriptor imported", name)
		}
		if !errors.Is(err, ipc.ErrBadDescriptor) {
			t.Errorf("%s: want ErrBadDescriptor, got %v", name, err)
		}
		if calls != 0 {
			t.Errorf("%s: %d driver calls for a forged descriptor, want 0", name, calls)
		}
	}
	faultinject.Reset()
	b, err := f.imp.Import(f.desc, f.s)
	if err != nil {
		t.Fatal(err)
	}
	if faultinject.Calls() == 0 {
		t.Error("the genuine import made no driver call: the count sees nothing")
	}
	if err := errors.Join(check(b, f.s, f.want), b.Close()); err != nil {
		t.Error(err)
	}
}
