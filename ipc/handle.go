package ipc

import (
	"fmt"
	"os"
	"sync"

	"github.com/cudamem/cudamem/cuda"
)

// Handle is an exported pool: an open file descriptor from the driver plus
// the pool's UUID. Send it to another process (SendHandle, or
// ExtraFile to a child) and import it there with ImportPool. A Handle owns
// its fd: Close closes it, once.
type Handle struct {
	uuid UUID

	mu sync.Mutex
	fd int // -1 once closed
}

// NewHandle takes ownership of fd (a pool exported by the driver, or one
// received from another process) under the given UUID.
func NewHandle(fd int, uuid UUID) (*Handle, error) {
	if fd < 0 {
		return nil, cuda.Errorf("ipc.NewHandle", cuda.ErrInvalidArgument, "negative file descriptor %d", fd)
	}
	return &Handle{fd: fd, uuid: uuid}, nil
}

// UUID names the exported pool.
func (h *Handle) UUID() UUID {
	if h == nil {
		return UUID{}
	}
	return h.uuid
}

// FD returns the file descriptor, still owned by h.
func (h *Handle) FD() (int, error) {
	if h == nil {
		return -1, cuda.Errorf("Handle.FD", cuda.ErrInvalidArgument, "nil handle")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fd < 0 {
		return -1, &cuda.OpError{Op: "Handle.FD", Err: fmt.Errorf("%w: handle %v", cuda.ErrClosed, h.uuid)}
	}
	return h.fd, nil
}

// ExtraFile returns a duplicate of the fd as an *os.File for
// exec.Cmd.ExtraFiles (the child sees it as fd 3+i); close it after Start.
func (h *Handle) ExtraFile() (*os.File, error) {
	fd, err := h.FD()
	if err != nil {
		return nil, err
	}
	return fileOf(fd, "cudamem-pool-"+h.uuid.String())
}

// Close closes the fd. It is idempotent.
func (h *Handle) Close() error {
	if h == nil {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fd < 0 {
		return nil
	}
	err := closeFD(h.fd)
	h.fd = -1
	return err
}
