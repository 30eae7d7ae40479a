package readme

import (
	"bytes"
	"errors"
	"fmt"
	"go/format"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const module = "github.com/cudamem/cudamem"

// repoRoot is the module root: two levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(mod, []byte("module "+module+"\n")) {
		t.Fatalf("%s/go.mod is not the %s module", root, module)
	}
	return root
}

// goTool finds the go command, skipping (visibly) where there is none.
func goTool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("the go command is not on PATH: %v", err)
	}
	return p
}

var goBlock = regexp.MustCompile("(?ms)^```go\n(.*?)^```")

// goBlocks returns the ```go blocks of a Markdown file.
func goBlocks(md []byte) []string {
	var out []string
	for _, m := range goBlock.FindAllSubmatch(md, -1) {
		out = append(out, string(m[1]))
	}
	return out
}

func TestGoBlocksExtracted(t *testing.T) {
	md := "text\n```go\npackage main\n```\n```\nnot go\n```\n  ```go\nindented: not a block of the page\n  ```\n```go\nfunc main() {}\n```\n"
	got := goBlocks([]byte(md))
	want := []string{"package main\n", "func main() {}\n"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("goBlocks = %q, want %q", got, want)
	}
}

// Every ```go block of README.md is a whole, gofmt-clean program that
// builds (CGO_ENABLED=0) against this checkout, in a module of its own
// as a user's would be.
func TestReadmeProgramsBuild(t *testing.T) {
	root := repoRoot(t)
	md, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := goBlocks(md)
	if len(blocks) == 0 {
		t.Fatal("README.md has no ```go blocks")
	}
	gotool := goTool(t)
	dir := t.TempDir()
	for i, src := range blocks {
		name := fmt.Sprintf("example%d", i+1)
		if !strings.HasPrefix(src, "package main\n") || !strings.Contains(src, "\nfunc main() {") {
			t.Errorf("README.md ```go block %d is not a whole program (package main with func main):\n%s", i+1, src)
			continue
		}
		if fmtd, err := format.Source([]byte(src)); err != nil {
			t.Errorf("README.md ```go block %d does not parse: %v", i+1, err)
		} else if string(fmtd) != src {
			t.Errorf("README.md ```go block %d is not gofmt-formatted; gofmt makes it:\n%s", i+1, fmtd)
		}
		write(t, filepath.Join(dir, name, "main.go"), src)
	}
	if t.Failed() {
		return
	}
	write(t, filepath.Join(dir, "go.mod"), fmt.Sprintf("module readme.example\n\ngo 1.24\n\nrequire %s v0.0.0\n\nreplace %s => %s\n", module, module, filepath.ToSlash(root)))
	// The replaced module's requirements resolve from the module cache
	// (GOPROXY=off): their checksums are the checkout's own go.sum.
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "go.sum"), string(sum))

	// -o into a directory: with one program, go build would otherwise
	// write its binary beside the sources.
	cmd := exec.Command(gotool, "build", "-o", t.TempDir()+string(filepath.Separator), "./...")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-mod=mod", "GOPROXY=off", "GOWORK=off", "GOSUMDB=off", "GOTOOLCHAIN=local")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("README.md programs do not build (%v):\n%s", err, out)
	}
	t.Logf("built %d README.md programs", len(blocks))
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Every program in examples/ exits with status 1 and one line naming the
// missing driver when there is none (CUDAMEM_DRIVER points nowhere, so
// this holds on a GPU machine too).
func TestExamplesFailCleanlyWithoutDriver(t *testing.T) {
	root := repoRoot(t)
	gotool := goTool(t)
	bin := t.TempDir()
	build := exec.Command(gotool, "build", "-o", bin+string(filepath.Separator), "./examples/...")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOTOOLCHAIN=local")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/...: %v\n%s", err, out)
	}
	progs, err := os.ReadDir(bin)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"cublas-sgemm", "grow-array", "ipc-two-process", "nccl-allreduce", "streaming-pipeline"}
	var names []string
	for _, p := range progs {
		names = append(names, strings.TrimSuffix(p.Name(), ".exe"))
	}
	if fmt.Sprint(names) != fmt.Sprint(want) {
		t.Errorf("examples built: %v, want %v", names, want)
	}
	missing := filepath.Join(t.TempDir(), "no-such-libcuda.so.1")
	for _, p := range progs {
		name := strings.TrimSuffix(p.Name(), ".exe")
		t.Run(name, func(t *testing.T) {
			cmd := exec.Command(filepath.Join(bin, p.Name()))
			cmd.Env = append(os.Environ(), "CUDAMEM_DRIVER="+missing)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 1 {
				t.Fatalf("exit: %v, want status 1\nstderr: %s", err, stderr.String())
			}
			msg := stderr.String()
			if !strings.HasPrefix(msg, name+": ") || strings.Count(msg, "\n") != 1 {
				t.Errorf("stderr is not one line starting %q: %q", name+": ", msg)
			}
			for _, s := range []string{"no CUDA driver", missing} {
				if !strings.Contains(msg, s) {
					t.Errorf("stderr does not mention %q: %q", s, msg)
				}
			}
			if strings.Contains(msg, "goroutine") || stdout.Len() > 0 {
				t.Errorf("unexpected output: stdout %q, stderr %q", stdout.String(), msg)
			}
		})
	}
}
