//go:build linux

package probe

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/cudamem/cudamem/internal/fakecuda"
)

var fake *fakecuda.Driver

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "probe")
	if err != nil {
		panic(err)
	}
	path, err := fakecuda.Build(dir)
	switch {
	case errors.Is(err, fakecuda.ErrNoCompiler) && !fakecuda.Required():
		fmt.Println("skipping probe tests:", err)
		os.RemoveAll(dir)
		return
	case err != nil:
		fmt.Println(err)
		os.Exit(1)
	}
	os.Setenv("CUDAMEM_DRIVER", path)
	os.Setenv("FAKECUDA_DEVICES", "2")
	if fake, err = fakecuda.Open(path); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	if dlpDir != "" {
		os.RemoveAll(dlpDir)
	}
	os.Exit(code)
}
