package main

import (
	"strings"
	"testing"

	"github.com/cudamem/cudamem/examples/internal/extest"
	"github.com/cudamem/cudamem/loader"
)

func TestMain(m *testing.M) { extest.Main(m, main) }

// -h prints the usage; a bad flag, a bad size or an argument is refused
// with it.
func TestFlags(t *testing.T) {
	extest.CheckFlags(t, "cublas-sgemm")
	env, _ := extest.NoDriver(t)
	code, _, stderr := extest.Run(t, env, "-m", "0")
	if code != 2 || !strings.HasPrefix(stderr, "cublas-sgemm: sizes and reps must be positive") {
		t.Errorf("-m 0: status %d, stderr %q; want 2 and the error first", code, stderr)
	}
}

// Without a driver: one line, naming the path tried.
func TestNoDriver(t *testing.T) { extest.CheckNoDriver(t, "cublas-sgemm") }

// On the fake driver, without cuBLAS, one line says what is missing.
// (Where cuBLAS is installed it would use the real driver: skipped.)
func TestOnFakeDriverWithoutCublas(t *testing.T) {
	if lib, err := loader.OpenCUDALibrary("cublas"); err == nil {
		lib.Close()
		t.Skip("cuBLAS is installed here; it would not run on the fake driver")
	}
	code, stdout, stderr := extest.Run(t, extest.Fake(t, "1"))
	if code != 1 || stdout != "" || strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, `cublas-sgemm: CUDA library "cublas" not found`) {
		t.Fatalf("status %d, stdout %q, stderr %q; want 1 and one line naming cuBLAS", code, stdout, stderr)
	}
}
