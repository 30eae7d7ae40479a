package ipc

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"weak"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/osfd"
	"github.com/cudamem/cudamem/resource"
)

// ExportablePool is a pool resource that can be exported: an IPC-enabled
// resource.DevicePool or resource.PinnedPool.
type ExportablePool interface {
	buffer.MemoryResource
	Pool() cuda.MemPool
	IsIPCEnabled() bool
	IsClosed() bool
}

var (
	_ ExportablePool = (*resource.DevicePool)(nil)
	_ ExportablePool = (*resource.PinnedPool)(nil)
	_ ExportablePool = (*ImportedPool)(nil)
)

// withPool runs fn with p's driver pool held open (resource.DevicePool and
// PinnedPool's Use): a concurrent Close waits, so the driver pool cannot
// be destroyed under an export.
func withPool(op string, p ExportablePool, fn func(pool cuda.MemPool) error) error {
	u, ok := p.(interface {
		Use(fn func(pool cuda.MemPool) error) error
	})
	if !ok {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "%T cannot be held open for an export", p)
	}
	return u.Use(fn)
}

// exportState is what this package remembers of an exported pool.
type exportState struct {
	uuid UUID
	// key authenticates the pool's descriptors: it goes out with every
	// Handle of the pool and seals every descriptor ExportBuffer makes.
	key poolKey

	mu sync.Mutex
	// exported is set once the driver pool was exported as a shareable
	// handle: the driver refuses cuMemPoolExportPointer on a pool never
	// exported, so ExportBuffer exports it once first.
	exported bool
}

// exportStates holds the export state of every pool exported so far,
// keyed by a weak pointer to the pool: the state lives as long as the pool
// object, so a pool keeps one UUID and key.
var exportStates sync.Map // weak.Pointer[resource.DevicePool or PinnedPool] -> *exportState

// poolState returns p's export state, making one (its UUID and key) on
// first use: the first ExportPool or ExportBuffer of the pool.
func poolState(op string, p ExportablePool) (*exportState, error) {
	switch q := p.(type) {
	case *resource.DevicePool:
		if q != nil {
			return stateOf(q), nil
		}
	case *resource.PinnedPool:
		if q != nil {
			return stateOf(q), nil
		}
	}
	return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "%T is not an exportable pool (a resource.DevicePool or PinnedPool)", p)
}

func stateOf[T any](p *T) *exportState {
	k := weak.Make(p)
	if v, ok := exportStates.Load(k); ok {
		return v.(*exportState)
	}
	v, loaded := exportStates.LoadOrStore(k, &exportState{uuid: cuda.NewUUID(), key: newPoolKey()})
	if !loaded {
		runtime.AddCleanup(p, func(k weak.Pointer[T]) { exportStates.Delete(k) }, k)
	}
	return v.(*exportState)
}

// ensureExported exports pool once as a shareable handle (a fabric handle
// for a pool with fabric handles only) unless that was done already.
func (st *exportState) ensureExported(pool cuda.MemPool, types cuda.MemHandleType) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.exported {
		return nil
	}
	if types&cuda.MemHandleTypePosixFileDescriptor == 0 && types&cuda.MemHandleTypeFabric != 0 {
		if _, err := pool.ExportFabric(); err != nil {
			return fmt.Errorf("exporting the pool once before its first buffer: %w", err)
		}
		st.exported = true
		return nil
	}
	fd, err := pool.ExportFD()
	if err != nil {
		return fmt.Errorf("exporting the pool once before its first buffer: %w", err)
	}
	st.exported = true
	if err := osfd.Close(fd); err != nil {
		return fmt.Errorf("closing the pool's first export: %w", err)
	}
	return nil
}

func (st *exportState) markExported() {
	st.mu.Lock()
	st.exported = true
	st.mu.Unlock()
}

func checkExportable(op string, p ExportablePool) error {
	if p == nil {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil pool")
	}
	if p.IsClosed() {
		return &cuda.OpError{Op: op, Err: cuda.ErrClosed}
	}
	if !p.IsIPCEnabled() {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "memory resource is not IPC-enabled (create the pool with IPC set)")
	}
	return nil
}

// ExportPool exports an IPC-enabled pool as a new Handle, which the caller
// owns and closes. Every export of one pool carries the same UUID and
// secret key (made on its first export). A concurrent Close of the pool
// waits for the export.
func ExportPool(p ExportablePool) (*Handle, error) {
	const op = "ipc.ExportPool"
	if ip, ok := p.(*ImportedPool); ok {
		return ip.export()
	}
	var h *Handle
	err := exportPool(op, p, cuda.MemHandleTypePosixFileDescriptor, "POSIX fd handles (fabric only: use ExportPoolFabric)", func(pool cuda.MemPool, st *exportState) error {
		fd, err := pool.ExportFD()
		if err != nil {
			return &cuda.OpError{Op: op, Err: err}
		}
		st.markExported()
		if h, err = newHandle(op, fd, st.uuid, st.key); err != nil {
			if cerr := osfd.Close(fd); cerr != nil {
				err = errors.Join(err, cerr)
			}
			return err
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}

// exportPool is the part ExportPool and ExportPoolFabric share: it checks
// that p can export and was created with handle type want (else the error
// says the pool was created without what), then runs export with the pool
// held.
func exportPool(op string, p ExportablePool, want cuda.MemHandleType, what string, export func(cuda.MemPool, *exportState) error) error {
	if err := checkExportable(op, p); err != nil {
		return err
	}
	if handleTypes(p)&want == 0 {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "pool was created without %s", what)
	}
	st, err := poolState(op, p)
	if err != nil {
		return err
	}
	return withPool(op, p, func(pool cuda.MemPool) error { return export(pool, st) })
}

// ExportBuffer describes b, a whole buffer of an IPC-enabled pool (or of
// an imported pool: re-export), for a process that imported the pool. The
// descriptor is sealed with the pool's key (its MAC), which importers
// check before anything reaches the driver; a re-export is sealed with
// the key the imported pool's Handle carried (none if it had none). It
// works whether or not the pool was exported before. It first waits for
// b's allocation stream: a stream-ordered allocation exists, and can be
// exported, once its stream reaches it. A closed b, or a b whose pool is
// closed, gives an error matching cuda.ErrClosed.
func ExportBuffer(b *buffer.Buffer) (Descriptor, error) {
	const op = "ipc.ExportBuffer"
	if b == nil || b.IsClosed() {
		return Descriptor{}, &cuda.OpError{Op: op, Err: cuda.ErrClosed}
	}
	if !b.IsOwned() || b.Size() == 0 {
		return Descriptor{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "%v is a view, borrowed or empty: export a whole allocation", b)
	}
	// The resource is read with b held open: a Close racing a bare read
	// would make it nil, and the buffer "not of an exportable pool".
	var res buffer.MemoryResource
	if err := b.Use(op, func(cuda.DevicePtr) error {
		if res = b.Resource(); res == nil {
			return &cuda.OpError{Op: op, Err: cuda.ErrClosed}
		}
		return nil
	}); err != nil {
		return Descriptor{}, err
	}
	switch mr := res.(type) {
	case *ImportedPool:
		return mr.descriptor(b)
	case ExportablePool:
		if err := checkExportable(op, mr); err != nil {
			return Descriptor{}, err
		}
		st, err := poolState(op, mr)
		if err != nil {
			return Descriptor{}, err
		}
		if s := b.Stream(); s != nil {
			if err := s.Sync(); err != nil {
				return Descriptor{}, &cuda.OpError{Op: op, Err: err}
			}
		}
		var data cuda.MemPoolPtrExportData
		size := b.Size()
		// The buffer is held first and the pool inside it: a buffer's
		// Close frees into its pool, so the other order could wait on a
		// Close that waits on the pool.
		err = b.Use(op, func(ptr cuda.DevicePtr) error {
			return withPool(op, mr, func(pool cuda.MemPool) error {
				if err := st.ensureExported(pool, handleTypes(mr)); err != nil {
					return &cuda.OpError{Op: op, Err: err}
				}
				var err error
				if data, err = pool.ExportPointer(ptr); err != nil {
					return &cuda.OpError{Op: op, Err: fmt.Errorf("%#x (%d bytes): %w", uint64(ptr), size, err)}
				}
				return nil
			})
		})
		if err != nil {
			return Descriptor{}, err
		}
		return st.key.seal(Descriptor{Pool: st.uuid, Size: size, Data: data}), nil
	default:
		return Descriptor{}, cuda.Errorf(op, cuda.ErrInvalidArgument, "%v comes from %T, not an exportable pool", b, mr)
	}
}
