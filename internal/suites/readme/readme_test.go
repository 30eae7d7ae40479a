package readme

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const module = "github.com/cudamem/cudamem"

// repoRoot is the module root: three levels above this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
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
	want := []string{"cublas-sgemm", "grow-array", "ipc-two-process", "nccl-allreduce", "sleep-wake", "streaming-pipeline"}
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
