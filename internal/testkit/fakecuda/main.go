package fakecuda

import (
	"errors"
	"fmt"
	"os"
)

// Install builds the fake driver into a new temporary directory, opens it
// for its counters and points this process at it: CUDAMEM_DRIVER, and
// FAKECUDA_DEVICES=2 unless already set, so that peer-access paths run.
// It is for a TestMain, before anything loads the driver. cleanup removes
// the directory (also when the error is not nil). Without a C compiler the
// error wraps ErrNoCompiler.
func Install(name string) (d *Driver, cleanup func(), err error) {
	dir, err := os.MkdirTemp("", name)
	if err != nil {
		return nil, func() {}, fmt.Errorf("fakecuda: temporary directory for %s: %w", name, err)
	}
	cleanup = func() { os.RemoveAll(dir) }
	path, err := Build(dir)
	if err != nil {
		return nil, cleanup, err
	}
	os.Setenv("CUDAMEM_DRIVER", path)
	if os.Getenv("FAKECUDA_DEVICES") == "" {
		os.Setenv("FAKECUDA_DEVICES", "2")
	}
	if d, err = Open(path); err != nil {
		return nil, cleanup, err
	}
	return d, cleanup, nil
}

// Main is the TestMain of a package whose tests all run against the fake
// driver (see Install): it sets *fake to the opened driver, runs the tests
// and exits with their status. Without a C compiler it prints one
// "skipping <name> tests" line and exits 0, unless Required; a fake that
// cannot be built or opened exits 1.
func Main(m interface{ Run() int }, name string, fake **Driver) {
	d, cleanup, err := Install(name)
	switch {
	case errors.Is(err, ErrNoCompiler) && !Required():
		fmt.Printf("skipping %s tests: %v\n", name, err)
		cleanup()
		os.Exit(0)
	case err != nil:
		fmt.Println(err)
		cleanup()
		os.Exit(1)
	}
	*fake = d
	code := m.Run()
	cleanup()
	os.Exit(code)
}
