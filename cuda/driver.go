package cuda

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// load opens the driver once; its error matches ErrNoDriver when no
// library loaded, and the cuInit Result (for example ErrorNoDevice) when
// the driver loaded but failed to initialize.
var load = sync.OnceValues(func() (*loader.Driver, error) {
	d, err := loader.Load()
	var ie *loader.InitError
	switch {
	case errors.As(err, &ie):
		return nil, &OpError{Op: "cuInit", Err: Result(ie.Code)}
	case err != nil:
		return nil, &noDriverError{err}
	}
	return d, nil
})

// noDriverError is a load failure: it matches ErrNoDriver and wraps the
// loader's error (a *loader.LoadError listing what was tried), saying "no
// CUDA driver" once.
type noDriverError struct{ err error }

func (e *noDriverError) Error() string {
	msg := e.err.Error()
	if strings.HasPrefix(msg, "no CUDA driver") {
		return "cuda: " + msg
	}
	return ErrNoDriver.Error() + ": " + msg
}

func (e *noDriverError) Unwrap() []error { return []error{ErrNoDriver, e.err} }

// Driver returns the loaded driver's library path and version, loading it
// if needed.
func Driver() (path string, version int, err error) {
	d, err := load()
	if err != nil {
		return "", 0, err
	}
	return d.Path, d.Version, nil
}

// DriverMissing lists the driver entry points cudamem uses that the loaded
// driver does not provide; features that need them report ErrNotSupported.
func DriverMissing() ([]string, error) {
	d, err := load()
	if err != nil {
		return nil, err
	}
	return d.Missing(), nil
}

// VersionString formats a CUDA version number (12080) as "12.8".
func VersionString(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

// ok reports whether a raw call result is CUDA_SUCCESS. Only the low 32
// bits are meaningful: CUresult is a C int.
func ok(r uintptr) bool { return int32(r) == 0 }

// fail turns a raw call result into an error naming the entry point. Call
// it only when !ok(r).
func fail(p *loader.Proc, r uintptr) error {
	if r == loader.NotFound {
		return &OpError{Op: p.Name(), Err: fmt.Errorf("%w: the installed driver does not provide %s", ErrNotSupported, p.Name())}
	}
	return &OpError{Op: p.Name(), Err: Result(int32(r))}
}

// result is fail for any r, returning nil on success.
func result(p *loader.Proc, r uintptr) error {
	if ok(r) {
		return nil
	}
	return fail(p, r)
}

// DriverVersion asks the driver for its CUDA version (cuDriverGetVersion),
// 1000*major + 10*minor. Every call is a driver call; Driver returns the
// version read at load time.
func DriverVersion() (int, error) {
	d, err := load()
	if err != nil {
		return 0, err
	}
	var v int32
	if r := d.DriverGetVersion.Call(uintptr(unsafe.Pointer(&v))); !ok(r) {
		return 0, fail(&d.DriverGetVersion, r)
	}
	return int(v), nil
}
