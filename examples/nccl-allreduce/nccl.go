package main

import (
	"fmt"
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// NCCL constants (nccl.h).
const (
	ncclFloat32 = 7 // ncclDataType_t
	ncclSum     = 0 // ncclRedOp_t

	ncclUniqueIDBytes = 128 // NCCL_UNIQUE_ID_BYTES: sizeof(ncclUniqueId)

	ncclWinCollSymmetric     = 0x01 // NCCL_WIN_COLL_SYMMETRIC
	ncclWinRequiredAlignment = 4096 // NCCL_WIN_REQUIRED_ALIGNMENT
)

// NCCL versions (ncclGetVersion: major*10000 + minor*100 + patch) that
// brought the optional calls.
const (
	verScalableInit = 22300 // ncclCommInitRankScalable
	verWindows      = 22700 // ncclCommWindowRegister, symmetric kernels
)

// nccl holds the library's functions. The first group is needed by every
// mode; the others are optional, unresolved (Found false) where the
// installed NCCL predates them, and each mode that needs one says so
// (need).
type nccl struct {
	path    string
	version int

	getVersion, errorString, commDestroy     loader.Proc
	groupStart, groupEnd, allReduce          loader.Proc
	commInitAll                              loader.Proc // one process, every local GPU
	getUniqueID, commInitRankScalable        loader.Proc // one process per rank
	commRegister, commDeregister             loader.Proc // registered buffers (NCCL ≥ 2.19)
	commWindowRegister, commWindowDeregister loader.Proc // symmetric memory (NCCL ≥ 2.27)
}

func openNCCL() (*nccl, error) {
	lib, err := loader.OpenCUDALibrary("nccl")
	if err != nil {
		return nil, err
	}
	n := &nccl{path: lib.Path()}
	for _, f := range []struct {
		p    *loader.Proc
		name string
	}{
		{&n.getVersion, "ncclGetVersion"}, {&n.errorString, "ncclGetErrorString"},
		{&n.commDestroy, "ncclCommDestroy"},
		{&n.groupStart, "ncclGroupStart"}, {&n.groupEnd, "ncclGroupEnd"},
		{&n.allReduce, "ncclAllReduce"},
	} {
		if *f.p, err = lib.Lookup(f.name); err != nil {
			return nil, fmt.Errorf("%s: %w", lib.Path(), err)
		}
	}
	// Optional: a missing symbol leaves an unresolved Proc, which need
	// turns into an error naming the NCCL version that has it.
	for _, f := range []struct {
		p    *loader.Proc
		name string
	}{
		{&n.commInitAll, "ncclCommInitAll"},
		{&n.getUniqueID, "ncclGetUniqueId"}, {&n.commInitRankScalable, "ncclCommInitRankScalable"},
		{&n.commRegister, "ncclCommRegister"}, {&n.commDeregister, "ncclCommDeregister"},
		{&n.commWindowRegister, "ncclCommWindowRegister"}, {&n.commWindowDeregister, "ncclCommWindowDeregister"},
	} {
		*f.p, _ = lib.Lookup(f.name)
	}
	var ver int32
	if err := n.check("ncclGetVersion", n.getVersion.Call(uintptr(unsafe.Pointer(&ver))), nil); err != nil {
		return nil, err
	}
	n.version = int(ver)
	return n, nil
}

// need reports an error unless every one of ps resolved; what says what
// they are for and since when NCCL has them.
func (n *nccl) need(what string, ps ...*loader.Proc) error {
	for _, p := range ps {
		if !p.Found() {
			return fmt.Errorf("%s (NCCL %s) has no %s: %s", n.path, versionString(n.version), p.Name(), what)
		}
	}
	return nil
}

// versionString writes an ncclGetVersion code as NCCL does: 22803 is
// 2.28.3 (codes below 10000 are the old major*1000 + minor*100 + patch).
func versionString(v int) string {
	if v < 10000 {
		return fmt.Sprintf("%d.%d.%d", v/1000, v%1000/100, v%100)
	}
	return fmt.Sprintf("%d.%d.%d", v/10000, v%10000/100, v%100)
}

// check turns an ncclResult_t into an error naming the function.
func (n *nccl) check(fn string, r uintptr, err error) error {
	if err != nil {
		return err // not called: cudamem could not make the context current
	}
	if uint32(r) == 0 { // a C enum: the register's upper half is undefined
		return nil
	}
	msg := fmt.Sprintf("ncclResult_t %d", int32(r))
	if p := n.errorString.Call(uintptr(uint32(r))); p != 0 {
		msg = cString(p)
	}
	return fmt.Errorf("%s: %s", fn, msg)
}

// cString copies a NUL-terminated C string (at most 256 bytes): NCCL's
// static error strings, which live as long as the library.
func cString(p uintptr) string {
	ptr := *(*unsafe.Pointer)(unsafe.Pointer(&p)) // C memory, not Go's
	b := unsafe.Slice((*byte)(ptr), 256)
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
