//go:build linux

package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
)

// The example on the CPU: over cudamem's fake driver (internal/testkit/fakecuda)
// and a fake NCCL (testdata/fakenccl.c) whose collectives sum host memory
// and which checks what a GPU run could not show without failing:
// the device current at each call, group use, the id passed between
// ranks, every registration and window deregistered before its
// communicator is destroyed. Each case runs in a process of its own (the
// driver is loaded once per process), which is this test binary.

// entryArgs is what an envEntry process runs: run or launch, and prints
// its Results on a resultPrefix line.
type entryArgs struct {
	Mode  string // "run" or "launch"
	Size  uint64
	Iters int
	GPUs  int
	Ranks int
}

func entry(spec string) int {
	var a entryArgs
	if err := json.Unmarshal([]byte(spec), &a); err != nil {
		fmt.Fprintln(os.Stderr, "entry:", err)
		return 2
	}
	var rs []Result
	var err error
	switch a.Mode {
	case "run":
		var res Result
		res, err = run(a.Size, a.Iters, a.GPUs)
		rs = []Result{res}
	case "launch":
		rs, err = launch(a.Ranks, int(a.Size>>20), a.Iters, time.Minute, testStarter(envChild), os.Stdout)
	default:
		err = fmt.Errorf("mode %q", a.Mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nccl-allreduce:", err)
		return 1
	}
	j, _ := json.Marshal(rs)
	fmt.Printf("%s%s\n", resultPrefix, j)
	return 0
}

var fakeLibs struct {
	once            sync.Once
	dir, noScalable string // each holds a libnccl.so.2
	driver          string
	err             error
	noCompiler      bool
}

// buildFakes builds the fake driver and two fake NCCLs (one without
// ncclCommInitRankScalable) once per test binary.
func buildFakes(t *testing.T) (driver, ncclDir, oldNCCLDir string) {
	t.Helper()
	f := &fakeLibs
	f.once.Do(func() {
		root, err := os.MkdirTemp("", "fakenccl-")
		if err != nil {
			f.err = err
			return
		}
		cleanups = append(cleanups, func() { os.RemoveAll(root) })
		if f.driver, err = fakecuda.Build(root); err != nil {
			f.err = err
			f.noCompiler = errors.Is(err, fakecuda.ErrNoCompiler)
			return
		}
		f.dir, f.noScalable = filepath.Join(root, "nccl"), filepath.Join(root, "nccl-2.22")
		for dir, flags := range map[string][]string{f.dir: nil, f.noScalable: {"-DFAKENCCL_NO_SCALABLE"}} {
			if err := os.Mkdir(dir, 0o755); err != nil {
				f.err = err
				return
			}
			args := append([]string{"-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", filepath.Join(dir, "libnccl.so.2")}, flags...)
			args = append(args, "testdata/fakenccl.c", "-ldl")
			if out, err := exec.Command(ccName(), args...).CombinedOutput(); err != nil {
				f.err = fmt.Errorf("building the fake NCCL: %v\n%s", err, out)
				return
			}
		}
	})
	switch {
	case f.err != nil && f.noCompiler && !fakecuda.Required():
		t.Skipf("the fake driver and NCCL need a C compiler (set CUDAMEM_REQUIRE_CC to fail instead): %v", f.err)
	case f.err != nil:
		t.Fatal(f.err)
	}
	return f.driver, f.dir, f.noScalable
}

func ccName() string {
	if cc := os.Getenv("CC"); cc != "" {
		return cc
	}
	return "cc"
}

// fakeRun runs a in a process over the fakes, with env added; it returns
// the Results, or the process's stderr when it failed.
func fakeRun(t *testing.T, a entryArgs, ncclDir string, env ...string) ([]Result, string, error) {
	t.Helper()
	driver, _, _ := buildFakes(t)
	spec, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envEntry+"="+string(spec), "CUDAMEM_DRIVER="+driver,
		"CUDAMEM_LIBRARY_PATH="+ncclDir, "FAKECUDA_DEVICES=2", "CUDAMEM_REQUIRE_GPU=")
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if err != nil {
		return nil, stdout.String() + stderr.String(), err
	}
	for _, line := range strings.Split(stdout.String(), "\n") {
		if strings.HasPrefix(line, resultPrefix) {
			var rs []Result
			if err := json.Unmarshal([]byte(line[len(resultPrefix):]), &rs); err != nil {
				t.Fatal(err)
			}
			t.Logf("process output:\n%s%s", stdout.String(), stderr.String())
			return rs, "", nil
		}
	}
	t.Fatalf("no result line:\n%s%s", stdout.String(), stderr.String())
	return nil, "", nil
}

// Both modes over the fakes: one process with two "GPUs"
// (ncclCommInitAll, group calls), and a rank process (-ranks 1, the id
// through the file, ncclCommInitRankScalable); every phase runs, the sums
// are right and the segment hooks' counts are those of a GPU run.
func TestFakeNCCLModes(t *testing.T) {
	_, dir, _ := buildFakes(t)
	for _, c := range []struct {
		name  string
		a     entryArgs
		ranks int
	}{
		{"one process, 2 GPUs", entryArgs{Mode: "run", Size: 1 << 20, Iters: 2}, 2},
		{"one process, 1 GPU", entryArgs{Mode: "run", Size: 1 << 20, Iters: 2, GPUs: 1}, 1},
		{"-ranks 1", entryArgs{Mode: "launch", Size: 1 << 20, Iters: 2, Ranks: 1}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			rs, out, err := fakeRun(t, c.a, dir)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			for _, res := range rs {
				checkResult(t, res, c.ranks)
				for _, p := range res.Phases {
					if !p.Ran() {
						t.Errorf("phase %s skipped over the fakes: %s", p.Name, p.Skipped)
					}
				}
				if s := res.Segments; s.Registered != 3*len(res.Local) || s.ByTrim != len(res.Local) || s.AfterClose != 2*len(res.Local) {
					t.Errorf("segment hooks: %+v, want per rank 3 registered, 1 by Trim, 2 after Close", s)
				}
			}
		})
	}
}

// Where NCCL has no windows, refuses one or makes none, the window phase
// is skipped and says why; the other phases still run.
func TestFakeNCCLWindowSkips(t *testing.T) {
	_, dir, _ := buildFakes(t)
	for _, c := range []struct {
		env, want string
	}{
		{"FAKENCCL_VERSION=22600", "has no symmetric-memory windows (2.27 or later)"},
		{"FAKENCCL_WINDOW=refuse", "NCCL refused the window: ncclCommWindowRegister: invalid usage"},
		{"FAKENCCL_WINDOW=none", "made no window on rank 0"},
	} {
		t.Run(c.env, func(t *testing.T) {
			rs, out, err := fakeRun(t, entryArgs{Mode: "run", Size: 1 << 20, Iters: 1}, dir, c.env)
			if err != nil {
				t.Fatalf("%v\n%s", err, out)
			}
			res := rs[0]
			checkResult(t, res, 2)
			if w := res.Phase("window"); w.Ran() || !strings.Contains(w.Skipped, c.want) {
				t.Errorf("window phase: %+v, want skipped with %q", w, c.want)
			}
			if !res.Phase("registered").Ran() {
				t.Error("registered phase skipped")
			}
		})
	}
}

// An NCCL without ncclCommInitRankScalable: -ranks fails at once, saying
// which call and which NCCL version has it; the one-process mode still
// works.
func TestFakeNCCLWithoutScalableInit(t *testing.T) {
	_, _, old := buildFakes(t)
	_, out, err := fakeRun(t, entryArgs{Mode: "launch", Size: 1 << 20, Iters: 1, Ranks: 1}, old)
	if err == nil {
		t.Fatal("launch succeeded without ncclCommInitRankScalable")
	}
	for _, want := range []string{"has no ncclCommInitRankScalable", "NCCL 2.23 or later", "by value"} {
		if !strings.Contains(out, want) {
			t.Errorf("error lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "[rank 0]") {
		t.Errorf("a rank was started:\n%s", out)
	}
	if _, out, err := fakeRun(t, entryArgs{Mode: "run", Size: 1 << 20, Iters: 1}, old); err != nil {
		t.Errorf("one-process mode: %v\n%s", err, out)
	}
}

// More ranks than GPUs: refused before any rank starts.
func TestFakeNCCLTooManyRanks(t *testing.T) {
	_, dir, _ := buildFakes(t)
	_, out, err := fakeRun(t, entryArgs{Mode: "launch", Size: 1 << 20, Iters: 1, Ranks: 3}, dir)
	if err == nil || !strings.Contains(out, "-ranks 3 needs 3 GPUs") || strings.Contains(out, "[rank") {
		t.Errorf("3 ranks on 2 GPUs: %v\n%s", err, out)
	}
}
