//go:build windows

package loader

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A bare DLL name is looked up in the system directory only: a file of
// that name in the working directory (a planted DLL) is never opened.
func TestOpenLibraryIgnoresWorkingDirectory(t *testing.T) {
	dir := t.TempDir()
	const name = "cudamem_planted_test.dll"
	if err := os.WriteFile(filepath.Join(dir, name), []byte("not a DLL"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	_, err := OpenLibrary(name)
	const errModNotFound = syscall.Errno(126) // ERROR_MOD_NOT_FOUND
	if !errors.Is(err, errModNotFound) {
		t.Fatalf("OpenLibrary(%q) = %v, want ERROR_MOD_NOT_FOUND (the planted file must not be tried)", name, err)
	}
	// By path it is tried, and refused for what it is.
	_, err = OpenLibrary(filepath.Join(dir, name))
	if err == nil || errors.Is(err, errModNotFound) {
		t.Fatalf("OpenLibrary by path = %v, want a load failure of the file itself", err)
	}
	if _, err := OpenLibrary(""); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("OpenLibrary(\"\") = %v, want ErrInvalidArgument", err)
	}
	// kernel32 is in the system directory: a bare name loads.
	l, err := OpenLibrary("kernel32.dll")
	if err != nil {
		t.Fatalf("OpenLibrary(kernel32.dll): %v", err)
	}
	if !strings.EqualFold(l.Path(), "kernel32.dll") {
		t.Errorf("Path = %q", l.Path())
	}
	if _, err := l.Lookup("GetTickCount64"); err != nil {
		t.Error(err)
	}
	if err := l.Close(); err != nil {
		t.Error(err)
	}
}
