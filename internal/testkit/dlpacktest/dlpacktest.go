package dlpacktest

import (
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"unsafe"

	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/loader"
)

//go:embed testdata/dlpacktest.c
var source []byte

// ErrNoCompiler is fakecuda's: callers skip on it unless Required.
var ErrNoCompiler = fakecuda.ErrNoCompiler

// Required reports whether a missing compiler must fail tests.
func Required() bool { return fakecuda.Required() }

// Lib is the loaded library.
type Lib struct {
	lib                                                          *loader.Library
	describe, fill, sum, del, delRet, delRaw, delThread, delMany loader.Proc
	deleted, make, alloc, free, layout                           loader.Proc
}

// Build compiles the library into dir with $CC (default cc) and loads it.
func Build(dir string) (*Lib, error) {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		return nil, fmt.Errorf("%w (%s): %v", ErrNoCompiler, cc, err)
	}
	src := filepath.Join(dir, "dlpacktest.c")
	if err := os.WriteFile(src, source, 0o644); err != nil {
		return nil, err
	}
	out := filepath.Join(dir, "libdlpacktest.so")
	if b, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-Wall", "-pthread", "-o", out, src).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("dlpacktest: %s failed: %v\n%s", cc, err, b)
	}
	l, err := loader.OpenLibrary(out)
	if err != nil {
		return nil, err
	}
	lib := &Lib{lib: l}
	for _, s := range []struct {
		p    *loader.Proc
		name string
	}{
		{&lib.describe, "dlt_describe"}, {&lib.fill, "dlt_fill"}, {&lib.sum, "dlt_sum"},
		{&lib.del, "dlt_delete"}, {&lib.delRet, "dlt_delete_ret"}, {&lib.delRaw, "dlt_delete_raw"}, {&lib.delThread, "dlt_delete_thread"},
		{&lib.delMany, "dlt_delete_threads"}, {&lib.deleted, "dlt_deleted"}, {&lib.make, "dlt_make"},
		{&lib.alloc, "dlt_alloc"}, {&lib.free, "dlt_free"}, {&lib.layout, "dlt_layout"},
	} {
		if *s.p, err = l.Lookup(s.name); err != nil {
			return nil, err
		}
	}
	return lib, nil
}

func b2i(v bool) uintptr {
	if v {
		return 1
	}
	return 0
}

// Fields is a tensor as C reads it.
type Fields struct {
	Major, Minor, Flags, DevType, DevID, NDim, Code, Bits, Lanes, Shape0, HasStrides, ByteOffset, Data int64
}

// Describe reads the fields of the tensor at p (versioned or not) in C.
func (l *Lib) Describe(p uintptr, versioned bool) Fields {
	var f Fields
	l.describe.Call(p, b2i(versioned), uintptr(unsafe.Pointer(&f)))
	return f
}

// Fill sets every byte of a 1-D host-reachable tensor to c, in C.
func (l *Lib) Fill(p uintptr, versioned bool, c byte) { l.fill.Call(p, b2i(versioned), uintptr(c)) }

// Sum adds up the bytes of a 1-D host-reachable tensor, in C.
func (l *Lib) Sum(p uintptr, versioned bool) uint64 { return uint64(l.sum.Call(p, b2i(versioned))) }

// Delete calls the tensor's deleter from C, on the calling thread.
func (l *Lib) Delete(p uintptr, versioned bool) { l.del.Call(p, b2i(versioned)) }

// DeleteTagged calls the tensor's deleter from C on the calling thread,
// as Delete does, and returns what the C function returned: tag, unless
// the call's result was lost on the way back to Go.
func (l *Lib) DeleteTagged(p uintptr, versioned bool, tag uint64) uint64 {
	return uint64(l.delRet.Call(p, b2i(versioned), uintptr(tag)))
}

// DeleteRaw calls the C function fn with argument arg (any value).
func (l *Lib) DeleteRaw(fn, arg uintptr) { l.delRaw.Call(fn, arg) }

// DeleteOnThread calls the deleter from a new C thread (pthread) and
// waits for it.
func (l *Lib) DeleteOnThread(p uintptr, versioned bool) error {
	if r := l.delThread.Call(p, b2i(versioned)); r != 0 {
		return fmt.Errorf("dlt_delete_thread: %d", int(r))
	}
	return nil
}

// DeleteOnThreads calls the deleters of ps from len(ps) C threads at once
// (at most 64).
func (l *Lib) DeleteOnThreads(ps []uintptr, versioned bool) error {
	if len(ps) == 0 {
		return nil
	}
	if r := l.delMany.Call(uintptr(unsafe.Pointer(&ps[0])), b2i(versioned), uintptr(len(ps))); r != 0 {
		return fmt.Errorf("dlt_delete_threads: %d", int(r))
	}
	return nil
}

// Deleted counts the calls of the deleters of tensors made by Make.
func (l *Lib) Deleted() int64 { return int64(l.deleted.Call()) }

// Spec describes a tensor for Make.
type Spec struct {
	DevType, DevID int32
	Code, Bits     uint8
	Lanes          uint16
	ByteOffset     uint64
	Flags          uint64
	Major          uint32
	Shape, Strides []int64 // Strides nil: none
}

// Make builds a tensor in C (malloc) over data whose deleter counts its
// calls (Deleted) and frees it.
func (l *Lib) Make(versioned bool, data uintptr, s Spec) uintptr {
	hasStrides := int64(0)
	dims := append([]int64{}, s.Shape...)
	if s.Strides != nil {
		hasStrides = 1
		dims = append(dims, s.Strides...)
	}
	dims = append(dims, 0) // never empty
	spec := [10]int64{int64(s.DevType), int64(s.DevID), int64(len(s.Shape)), int64(s.Code), int64(s.Bits),
		int64(s.Lanes), int64(s.ByteOffset), int64(s.Flags), int64(s.Major), hasStrides}
	return l.make.Call(b2i(versioned), data, uintptr(unsafe.Pointer(&spec[0])), uintptr(unsafe.Pointer(&dims[0])))
}

// Alloc returns n zeroed bytes of C heap memory; Free frees them.
func (l *Lib) Alloc(n uint64) uintptr { return l.alloc.Call(uintptr(n)) }

// Free frees memory from Alloc.
func (l *Lib) Free(p uintptr) { l.free.Call(p) }

// Layout returns C's sizeof and offsetof facts (see dlt_layout).
func (l *Lib) Layout(i int) int64 { return int64(l.layout.Call(uintptr(i))) }
