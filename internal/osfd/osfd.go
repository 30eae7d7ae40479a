package osfd

import (
	"fmt"
	"os"
	"runtime"
	"sync/atomic"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/warn"
)

// File owns one open file descriptor. Its lifecycle is cuda.Guard's: each
// use of the descriptor is a call, and Close (or Release) waits for the
// calls in flight before the descriptor goes.
type File struct {
	life cuda.Guard
	fd   int
	made bool // set by New: tells a closed File from the zero value
	// cleanup closes the descriptor if the File is collected while open.
	cleanup runtime.Cleanup
}

var leaks atomic.Int64

// Leaks returns how many Files were garbage collected while still open
// (their descriptors were closed by the safety net). Tests assert it stays 0.
func Leaks() int64 { return leaks.Load() }

// leaked is the safety net. It captures the descriptor number only, never
// the File, so the File can be collected.
func leaked(fd int) {
	leaks.Add(1)
	// Nothing to return it to: the owner is gone.
	warn.Failed("file descriptor safety net: close", closeFD(fd), "fd", fd)
}

// New takes ownership of fd, which must be open and not owned elsewhere,
// and sets close-on-exec on it: a descriptor this process was given (an
// inherited one, say) would otherwise pass on to every child it starts,
// and their children, pool keys and all. A fork between the descriptor's
// arrival and New can still inherit it; receive descriptors with the flag
// already set where the system allows (MSG_CMSG_CLOEXEC) to close that
// window. If the flag cannot be set, ownership is not taken: fd stays the
// caller's to close.
func New(fd int) (*File, error) {
	if fd < 0 {
		return nil, cuda.Errorf("osfd.New", cuda.ErrInvalidArgument, "negative file descriptor %d", fd)
	}
	if err := supported("osfd.New"); err != nil {
		return nil, err
	}
	if err := checkOpen(fd); err != nil {
		return nil, cuda.Errorf("osfd.New", cuda.ErrInvalidArgument, "file descriptor %d is not open: %v", fd, err)
	}
	if err := setCloexec(fd); err != nil {
		return nil, &cuda.OpError{Op: "osfd.New", Err: fmt.Errorf("setting close-on-exec on file descriptor %d: %w", fd, err)}
	}
	f := &File{fd: fd, made: true}
	f.cleanup = runtime.AddCleanup(f, leaked, fd)
	return f, nil
}

func errZero(op string) error {
	return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil or zero *osfd.File (use osfd.New)")
}

func errClosed(op string, fd int) error {
	return &cuda.OpError{Op: op, Err: fmt.Errorf("%w: file descriptor %d", cuda.ErrClosed, fd)}
}

// enter starts a use of f's descriptor; f.life.Leave must follow on
// success.
func (f *File) enter(op string) (int, error) {
	if f == nil || !f.made {
		return -1, errZero(op)
	}
	if !f.life.Enter() {
		return -1, errClosed(op, f.fd)
	}
	return f.fd, nil
}

// Int returns the descriptor number, still owned by f. Prefer Use where a
// concurrent Close is possible: after Int returns, nothing keeps the number
// from being closed and reused.
func (f *File) Int() (int, error) {
	fd, err := f.enter("osfd.File.Int")
	if err != nil {
		return -1, err
	}
	f.life.Leave()
	return fd, nil
}

// Use runs fn with the descriptor held open: Close waits until fn returns.
// fn must not close the descriptor, nor call f's Close or Release (they
// would wait for fn).
func (f *File) Use(fn func(fd int) error) error {
	fd, err := f.enter("osfd.File.Use")
	if err != nil {
		return err
	}
	defer f.life.Leave()
	return fn(fd)
}

// IsOpen reports whether f owns an open descriptor.
func (f *File) IsOpen() bool { return f != nil && f.made && !f.life.IsClosed() }

// Dup returns a new File owning a close-on-exec duplicate of f's descriptor.
func (f *File) Dup() (*File, error) {
	const op = "osfd.File.Dup"
	fd, err := f.enter(op)
	if err != nil {
		return nil, err
	}
	nfd, err := dupCloexec(fd)
	f.life.Leave()
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("file descriptor %d: %w", fd, err)}
	}
	return newOwned(nfd)
}

// OSFile returns a close-on-exec duplicate of the descriptor as an
// *os.File named name, for exec.Cmd.ExtraFiles (the child sees it as
// fd 3+i). The caller closes it; f stays open.
func (f *File) OSFile(name string) (*os.File, error) {
	d, err := f.Dup()
	if err != nil {
		return nil, err
	}
	fd, err := d.Release()
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), name), nil
}

// Release gives up ownership: it returns the descriptor, which the caller
// now closes, and f becomes closed without closing it.
func (f *File) Release() (int, error) {
	const op = "osfd.File.Release"
	if f == nil || !f.made {
		return -1, errZero(op)
	}
	if !f.life.Close() {
		return -1, errClosed(op, f.fd)
	}
	f.cleanup.Stop()
	return f.fd, nil
}

// Close closes the descriptor once; later calls return nil. On a nil or
// zero File it does nothing (it never closes descriptor 0). If the close
// itself fails the descriptor is still considered gone (POSIX leaves its
// state unspecified, and Linux always releases it), so Close is never
// retried on a number that may already belong to someone else.
func (f *File) Close() error {
	if f == nil || !f.made || !f.life.Close() {
		return nil
	}
	f.cleanup.Stop()
	if err := closeFD(f.fd); err != nil {
		return &cuda.OpError{Op: "osfd.File.Close", Err: fmt.Errorf("file descriptor %d: %w", f.fd, err)}
	}
	return nil
}

// String describes f for messages.
func (f *File) String() string {
	if f == nil {
		return "osfd.File(nil)"
	}
	if !f.IsOpen() {
		return "osfd.File(closed)"
	}
	return fmt.Sprintf("osfd.File(%d)", f.fd)
}

// Close closes a bare descriptor number the caller owns (a received
// descriptor that never became a File, say). Negative numbers are refused.
func Close(fd int) error {
	if fd < 0 {
		return cuda.Errorf("osfd.Close", cuda.ErrInvalidArgument, "negative file descriptor %d", fd)
	}
	if err := closeFD(fd); err != nil {
		return &cuda.OpError{Op: "osfd.Close", Err: fmt.Errorf("file descriptor %d: %w", fd, err)}
	}
	return nil
}

// CloseAll closes every descriptor in fds and joins the failures.
func CloseAll(fds []int) error {
	var errs []error
	for _, fd := range fds {
		if err := Close(fd); err != nil {
			errs = append(errs, err)
		}
	}
	return joinErrs(errs)
}

// DupInt returns a close-on-exec duplicate of a descriptor the caller
// holds (not owned by a File), owned by the returned File.
func DupInt(fd int) (*File, error) {
	if fd < 0 {
		return nil, cuda.Errorf("osfd.DupInt", cuda.ErrInvalidArgument, "negative file descriptor %d", fd)
	}
	if err := supported("osfd.DupInt"); err != nil {
		return nil, err
	}
	nfd, err := dupCloexec(fd)
	if err != nil {
		return nil, &cuda.OpError{Op: "osfd.DupInt", Err: fmt.Errorf("file descriptor %d: %w", fd, err)}
	}
	return newOwned(nfd)
}

// newOwned is New for a descriptor this package just made (a duplicate):
// if New refuses it, nobody else owns it, so it is closed here rather
// than leaked.
func newOwned(fd int) (*File, error) {
	f, err := New(fd)
	if err != nil {
		_ = closeFD(fd)
		return nil, err
	}
	return f, nil
}
