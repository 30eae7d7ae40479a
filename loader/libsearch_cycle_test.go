//go:build linux && (amd64 || arm64)

package loader

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Two libraries of one directory that need each other (a DT_NEEDED
// cycle, neither loadable first) end in an error, not in an unbounded
// recursion of openWithDeps (found in review).
func TestOpenWithDepsCycle(t *testing.T) {
	dir := t.TempDir()
	foo, bar := filepath.Join(dir, "libcufoo.so.1"), filepath.Join(dir, "libcubar.so.1")
	// bar first without a dependency, so foo can link against it; then
	// bar again, needing foo.
	cc(t, bar, "int bar(void){return 2;}", "-Wl,-soname,libcubar.so.1")
	cc(t, foo, "int foo(void){return 1;}", "-Wl,-soname,libcufoo.so.1", "-L"+dir, "-Wl,--no-as-needed", "-l:libcubar.so.1")
	tmp := filepath.Join(dir, "bar.tmp")
	cc(t, tmp, "int bar(void){return 2;}", "-Wl,-soname,libcubar.so.1", "-L"+dir, "-Wl,--no-as-needed", "-l:libcufoo.so.1")
	if err := os.Rename(tmp, bar); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		l, err := openWithDeps(foo)
		if err == nil {
			l.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("opened a library whose dependency cannot load")
		}
		if !strings.Contains(err.Error(), "need each other") {
			t.Errorf("error does not name the cycle: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("openWithDeps did not return on a dependency cycle")
	}
}
