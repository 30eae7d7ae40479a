//go:build linux

package probe

import (
	"os"
	"testing"

	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
)

var fake *fakecuda.Driver

func TestMain(m *testing.M) { fakecuda.Main(cleanAfter{m}, "probe", &fake) }

// dlpDir is where the DLPack helper library was built, if it was
// (dlpack_test.go, on the architectures DLPack import supports).
var dlpDir string

// cleanAfter runs the tests, then removes what they built on the side
// (the DLPack helper library's directory).
type cleanAfter struct{ m *testing.M }

func (c cleanAfter) Run() int {
	code := c.m.Run()
	if dlpDir != "" {
		os.RemoveAll(dlpDir)
	}
	return code
}
