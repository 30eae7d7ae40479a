package cuda

import (
	"unsafe"

	"github.com/cudamem/cudamem/loader"
)

// openDriver is loader.Open and newDriver: a particular driver library.
func openDriver(paths ...string) (*driver, error) {
	d, err := loader.Open(paths...)
	if err != nil {
		return nil, err
	}
	return newDriver(d)
}

// currentContext returns the context current on the OS thread that runs
// the call; cudamem never relies on it.
func currentContext(d *Device) (uintptr, error) {
	if err := d.check("currentContext"); err != nil {
		return 0, err
	}
	var c uintptr
	if r := d.drv.CtxGetCurrent.Call(uintptr(unsafe.Pointer(&c))); !ok(r) {
		return 0, fail(&d.drv.CtxGetCurrent, r)
	}
	return c, nil
}
