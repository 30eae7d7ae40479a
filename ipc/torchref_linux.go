//go:build linux

package ipc

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/osfd"
)

// shmDir is where shm_open keeps shared-memory objects on Linux (a name
// "/torch_1_2" is the file /dev/shm/torch_1_2); tests point it at a
// directory of their own.
var shmDir = "/dev/shm"

// torchRefFile is an open counter file of torch's, checked: a regular
// file holding the header and counter index.
type torchRefFile struct {
	f        *osfd.File
	path     string
	need     int // bytes from the start to the end of the counter
	dev, ino uint64
}

// openTorchRefFile opens the counter file name (checked by the caller)
// and checks it before anything is written to it (the name comes from
// another process): a regular file of the header and whole counters,
// holding counter index; its header counts at least one process and the
// counter is at least 1. Every refusal matches cuda.ErrInvalidArgument.
func openTorchRefFile(op, name string, index uint64) (torchRefFile, torchRefKey, error) {
	path := shmDir + name
	var fd int
	var err error
	for {
		fd, err = syscall.Open(path, syscall.O_RDWR|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
		if err != syscall.EINTR {
			break
		}
	}
	if err != nil {
		return torchRefFile{}, torchRefKey{}, &cuda.OpError{Op: op, Err: fmt.Errorf("opening torch's reference-counter file %s: %w", name, err)}
	}
	f, err := osfd.New(fd)
	if err != nil {
		return torchRefFile{}, torchRefKey{}, errors.Join(&cuda.OpError{Op: op, Err: err}, osfd.Close(fd))
	}
	t := torchRefFile{f: f, path: path}
	fail := func(err error) (torchRefFile, torchRefKey, error) {
		return torchRefFile{}, torchRefKey{}, errors.Join(err, t.close())
	}
	bad := func(format string, args ...any) (torchRefFile, torchRefKey, error) {
		return fail(cuda.Errorf(op, cuda.ErrInvalidArgument, "torch's reference-counter file %s: "+format, append([]any{name}, args...)...))
	}
	var st syscall.Stat_t
	if err := f.Use(func(fd int) error { return syscall.Fstat(fd, &st) }); err != nil {
		return fail(&cuda.OpError{Op: op, Err: fmt.Errorf("fstat of torch's reference-counter file %s: %w", name, err)})
	}
	if st.Mode&syscall.S_IFMT != syscall.S_IFREG {
		return bad("not a regular file (mode %#o)", uint32(st.Mode))
	}
	size := st.Size
	if size < torchRefHeader+8 || size > torchRefHeader+8*torchRefMaxCounters || (size-torchRefHeader)%8 != 0 {
		return bad("%d bytes, not a header of %d and 1 to %d counters of 8 bytes", size, torchRefHeader, torchRefMaxCounters)
	}
	if counters := uint64(size-torchRefHeader) / 8; index >= counters {
		return bad("counter %d asked for, the file holds %d", index, counters)
	}
	t.need = torchRefHeader + 8*int(index+1)
	t.dev, t.ino = uint64(st.Dev), st.Ino
	var users int32
	var count int64
	err = t.mapped(func(hdr *int32, ctr *int64) error {
		users, count = atomic.LoadInt32(hdr), atomic.LoadInt64(ctr)
		return nil
	}, index)
	switch {
	case err != nil:
		return fail(&cuda.OpError{Op: op, Err: fmt.Errorf("reading torch's reference-counter file %s: %w", name, err)})
	case users < 1:
		return bad("its header counts %d processes using it: its producer let go of it", users)
	case count < 1:
		return bad("counter %d is %d: nothing to release (released already, or not this share's counter)", index, count)
	}
	return t, torchRefKey{dev: t.dev, ino: t.ino, index: index}, nil
}

// mapped maps the file up to counter index and runs fn with the header's
// count of users and the counter. The file belongs to another process,
// which may truncate it meanwhile: a fault on the mapping is an error, not
// a crash.
func (t torchRefFile) mapped(fn func(hdr *int32, ctr *int64) error, index uint64) error {
	return t.f.Use(func(fd int) (err error) {
		b, err := syscall.Mmap(fd, 0, t.need, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
		if err != nil {
			return fmt.Errorf("mapping %d bytes: %w", t.need, err)
		}
		defer func() {
			if uerr := syscall.Munmap(b); uerr != nil {
				err = errors.Join(err, fmt.Errorf("unmapping: %w", uerr))
			}
		}()
		return guardFault(func() error {
			return fn((*int32)(unsafe.Pointer(&b[0])), (*int64)(unsafe.Pointer(&b[torchRefHeader+8*index])))
		})
	})
}

// guardFault runs fn, turning a fault on memory it touches (a mapped file
// truncated under it) into an error.
func guardFault(fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(interface{ Addr() uintptr }); !ok {
				panic(r)
			}
			err = fmt.Errorf("the mapped file faulted (truncated by another process?): %v", r)
		}
	}()
	return fn()
}

// releaseCounter decrements counter index, as torch's consumer does: it
// joins the file's users while it writes (only while they are at least 1),
// decrements the counter only while it is at least 1, and leaves; whoever
// takes the users to 0 removes the file (if the name still names it).
func (t torchRefFile) releaseCounter(name string, index uint64) error {
	return t.mapped(func(hdr *int32, ctr *int64) error {
		for {
			u := atomic.LoadInt32(hdr)
			if u < 1 {
				return fmt.Errorf("the file's header counts %d processes using it: its producer let go of it, nothing to release", u)
			}
			if atomic.CompareAndSwapInt32(hdr, u, u+1) {
				break
			}
		}
		var err error
		for {
			c := atomic.LoadInt64(ctr)
			if c < 1 {
				err = fmt.Errorf("the counter is %d: nothing to release (released already?)", c)
				break
			}
			if atomic.CompareAndSwapInt64(ctr, c, c-1) {
				break
			}
		}
		if atomic.AddInt32(hdr, -1) == 0 {
			err = errors.Join(err, t.unlinkIfSame())
		}
		return err
	}, index)
}

// unlinkIfSame removes the file's name if it still names this file.
func (t torchRefFile) unlinkIfSame() error {
	var st syscall.Stat_t
	if err := syscall.Lstat(t.path, &st); err != nil {
		if err == syscall.ENOENT {
			return nil
		}
		return fmt.Errorf("looking up %s to remove it: %w", t.path, err)
	}
	if uint64(st.Dev) != t.dev || st.Ino != t.ino {
		return nil
	}
	if err := syscall.Unlink(t.path); err != nil && err != syscall.ENOENT {
		return fmt.Errorf("removing %s, which no process uses any more: %w", t.path, err)
	}
	return nil
}

func (t torchRefFile) close() error {
	if t.f == nil {
		return nil
	}
	return t.f.Close()
}
