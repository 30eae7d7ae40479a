package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
)

// fakeLib is the fake driver library's file name in its directory.
const fakeLib = "libfakecuda.so"

// runFakeDriver is `cudamem fake-driver`: build the fake CUDA driver (C,
// embedded in this binary) with the system's C compiler, and print how to
// point cudamem at it. The output is shell: comments and an export line,
// so that eval "$(cudamem fake-driver)" sets it up.
func runFakeDriver(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("fake-driver", stderr)
	dir := fs.String("o", "", "build the library in `DIR` (made if missing; default: cudamem/fake-driver in the user cache directory)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: takes no arguments, got %q", errUsage, fs.Args())
	}
	if *dir == "" {
		cache, err := os.UserCacheDir()
		if err != nil {
			return fmt.Errorf("no user cache directory to build in (%v): name one with -o DIR", err)
		}
		*dir = filepath.Join(cache, "cudamem", "fake-driver")
	}
	path, err := buildFake(*dir)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, `# cudamem's fake CUDA driver, built from its C source (%s):
# host memory stands in for GPU memory; no GPU, CUDA toolkit or NVIDIA driver is used.
# Point cudamem programs at it (or run: eval "$(cudamem fake-driver)"):
export %s=%s
# Optional, two fake GPUs (default one), for the peer-copy paths:
#   export FAKECUDA_DEVICES=2
# Then try: cudamem info; cudamem selftest
# Back to the real driver: unset %s
`, filepath.Join(filepath.Dir(path), "fakecuda.c"), "CUDAMEM_DRIVER", shellQuote(path), "CUDAMEM_DRIVER")
	return nil
}

// buildFake compiles the fake driver into dir and returns the library's
// absolute path. It builds in a directory of its own inside dir and moves
// the library into place only once it is built and loads: a failed build
// leaves dir as it was, and a program that has the old library loaded
// keeps its copy.
func buildFake(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if _, err := fakecuda.Compiler(); err != nil { // before anything is made
		return "", fmt.Errorf("building the fake driver needs a C compiler (gcc or clang; $CC names another): %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("-o: %w", err)
	}
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return "", fmt.Errorf("-o: %w", err)
	}
	defer os.RemoveAll(tmp)
	built, err := fakecuda.Build(tmp)
	switch {
	case errors.Is(err, fakecuda.ErrNoCompiler):
		return "", fmt.Errorf("building the fake driver needs a C compiler (gcc or clang; $CC names another): %w", err)
	case err != nil:
		return "", fmt.Errorf("building the fake driver: %w", err)
	}
	if !fakecuda.Is(built) {
		return "", fmt.Errorf("building the fake driver: %s was built but does not load as the fake driver", built)
	}
	path := filepath.Join(dir, fakeLib)
	for _, f := range []struct{ from, to string }{
		{filepath.Join(tmp, "fakecuda.c"), filepath.Join(dir, "fakecuda.c")},
		{built, path},
	} {
		if err := os.Rename(f.from, f.to); err != nil {
			return "", fmt.Errorf("building the fake driver: %w", err)
		}
	}
	return path, nil
}

// shellQuote quotes s for a POSIX shell where it needs quoting.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+,:@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
