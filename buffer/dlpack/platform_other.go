//go:build !(linux && (amd64 || arm64))

package dlpack

import "errors"

// supported is false: either purego cannot make C-callable functions
// here without cgo, or the loader cannot call C function pointers (it
// loads nothing on this system), so there is no way to hand a deleter
// out or to call one.
const supported = false

func deleterAddr() uintptr { return 0 }

var errUnsupported = errors.New("not supported on this system")

func readMem(dst []byte, addr uintptr) error { return errUnsupported }

func readablePages(addr, n uintptr) error { return errUnsupported }

func mappingsAllow(addr, n uintptr, need perm) error { return errNoMaps }
