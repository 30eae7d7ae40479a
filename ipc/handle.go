package ipc

import (
	"fmt"
	"os"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/osfd"
)

// Handle is an exported pool: an open file descriptor from the driver, the
// pool's UUID and, for pools exported by this package, the pool's secret
// key, which authenticates the pool's buffer descriptors. Send it to
// another process (SendHandle, or ExtraFile plus Token over a pipe to a
// child) and import it there with ImportPool. A Handle owns its fd, which
// is always close-on-exec: Close closes it, once. The zero Handle owns
// nothing; make Handles with ExportPool, ReceiveHandle or NewHandle.
// Formatting a Handle (any fmt verb) never shows its key.
type Handle struct {
	uuid UUID
	key  poolKey    // the zero poolKey: none
	f    *osfd.File // nil in the zero Handle
}

// NewHandle takes ownership of fd (a pool's fd passed to this process,
// e.g. through exec.Cmd.ExtraFiles, or received from another one) under
// token: a cudamem exporter's Handle.Token, or the pool's UUID alone (its
// String form) for an exporter that is not cudamem. It sets close-on-exec
// on fd, which an inherited fd lacks. A Handle made from a UUID alone has
// no pool key: a pool imported from it refuses every descriptor in Import
// (see ImportUnauthenticated). A malformed token is refused before
// anything is taken: fd stays the caller's to close then.
func NewHandle(fd int, token string) (*Handle, error) {
	const op = "ipc.NewHandle"
	if fd < 0 {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "negative file descriptor %d", fd)
	}
	u, k, err := parseToken(op, token)
	if err != nil {
		return nil, err
	}
	return newHandle(op, fd, u, k)
}

// newHandle takes ownership of fd under u and k.
func newHandle(op string, fd int, u UUID, k poolKey) (*Handle, error) {
	if u == (UUID{}) {
		// Imports are deduplicated by UUID: two pools both named by the
		// zero UUID would be taken for one.
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "zero UUID for fd %d (an fd that comes without one: NewForeignHandle)", fd)
	}
	f, err := osfd.New(fd)
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: err}
	}
	return &Handle{f: f, uuid: u, key: k}, nil
}

// UUID names the exported pool.
func (h *Handle) UUID() UUID {
	if h == nil {
		return UUID{}
	}
	return h.uuid
}

func (h *Handle) file(op string) (*osfd.File, error) {
	if h == nil || h.f == nil {
		return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "nil or zero *ipc.Handle (use NewHandle, ExportPool or ReceiveHandle)")
	}
	return h.f, nil
}

// FD returns the file descriptor, still owned by h: it is valid only until
// h is closed.
func (h *Handle) FD() (int, error) {
	f, err := h.file("Handle.FD")
	if err != nil {
		return -1, err
	}
	fd, err := f.Int()
	if err != nil {
		return -1, &cuda.OpError{Op: "Handle.FD", Err: err}
	}
	return fd, nil
}

// use runs fn with h's descriptor held open (a concurrent Close waits).
func (h *Handle) use(op string, fn func(fd int) error) error {
	f, err := h.file(op)
	if err != nil {
		return err
	}
	if !f.IsOpen() {
		// Named here, so the error says which call met the closed Handle.
		return &cuda.OpError{Op: op, Err: fmt.Errorf("closed *ipc.Handle of pool %v: %w", h.uuid, cuda.ErrClosed)}
	}
	return f.Use(fn)
}

// ExtraFile returns a close-on-exec duplicate of the fd as an *os.File for
// exec.Cmd.ExtraFiles (the child sees it as fd 3+i); close it after Start.
// Send h.Token() to the child over a pipe (never its environment: see
// Token), and the child makes its Handle with NewHandle(3+i, token).
func (h *Handle) ExtraFile() (*os.File, error) {
	f, err := h.file("Handle.ExtraFile")
	if err != nil {
		return nil, err
	}
	out, err := f.OSFile("cudamem-pool-" + h.uuid.String())
	if err != nil {
		return nil, &cuda.OpError{Op: "Handle.ExtraFile", Err: err}
	}
	return out, nil
}

// Close closes the fd. It is idempotent, and does nothing on a nil or
// zero Handle.
func (h *Handle) Close() error {
	if h == nil || h.f == nil {
		return nil
	}
	return h.f.Close()
}
