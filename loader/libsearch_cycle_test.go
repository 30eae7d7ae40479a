//go:build linux && (amd64 || arm64)

package loader

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Two libraries of one directory that need each other (a DT_NEEDED
// cycle, neither loadable first) end in an error, not in an unbounded
// recursion of openWithDeps (found in review).
func TestOpenWithDepsCycle(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc to build the two libraries")
	}
	dir := t.TempDir()
	sh := `set -e; cd "$1"
echo 'int foo(void){return 1;}' > foo.c; echo 'int bar(void){return 2;}' > bar.c
gcc -shared -fPIC -o libcubar.so.1 -Wl,-soname,libcubar.so.1 bar.c
gcc -shared -fPIC -o libcufoo.so.1 -Wl,-soname,libcufoo.so.1 foo.c -L. -Wl,--no-as-needed -l:libcubar.so.1
gcc -shared -fPIC -o bar.tmp -Wl,-soname,libcubar.so.1 bar.c -L. -Wl,--no-as-needed -l:libcufoo.so.1
mv bar.tmp libcubar.so.1`
	if out, err := exec.Command("sh", "-c", sh, "sh", dir).CombinedOutput(); err != nil {
		t.Fatalf("building the libraries: %v: %s", err, out)
	}
	done := make(chan error, 1)
	go func() {
		l, err := openWithDeps(filepath.Join(dir, "libcufoo.so.1"))
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
