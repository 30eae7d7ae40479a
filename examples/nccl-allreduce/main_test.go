package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/loader"
)

// The test binary doubles as a rank process: with envChild set (the flags,
// as JSON) it runs the program; with envFake it plays a rank for the
// CPU tests of spawn.
const (
	envChild = "NCCL_ALLREDUCE_TEST_CHILD"
	envFake  = "NCCL_ALLREDUCE_TEST_FAKE"
	envEntry = "NCCL_ALLREDUCE_TEST_ENTRY"
)

func TestMain(m *testing.M) {
	if a := os.Getenv(envChild); a != "" {
		var args []string
		if err := json.Unmarshal([]byte(a), &args); err != nil {
			fmt.Fprintln(os.Stderr, "nccl-allreduce test child:", err)
			os.Exit(2)
		}
		os.Exit(realMain(args, os.Stdout, os.Stderr, testStarter(envChild)))
	}
	if mode := os.Getenv(envFake); mode != "" {
		os.Exit(fakeRank(mode))
	}
	if e := os.Getenv(envEntry); e != "" {
		os.Exit(entry(e))
	}
	code := m.Run()
	for _, f := range cleanups {
		f()
	}
	os.Exit(code)
}

// cleanups run after the tests (the fakes' build directory).
var cleanups []func()

// testStarter runs a rank as this test binary with the program's flags.
func testStarter(env string) starter {
	return func(args []string) (*exec.Cmd, error) {
		j, err := json.Marshal(args)
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), env+"="+string(j))
		return cmd, nil
	}
}

// needNCCL skips without NCCL (it is not part of the driver).
func needNCCL(t *testing.T) *nccl {
	t.Helper()
	n, err := openNCCL()
	if err != nil {
		var le *loader.LibraryError
		if errors.As(err, &le) {
			t.Skipf("NCCL not found: %v", err)
		}
		t.Fatal(err)
	}
	t.Logf("NCCL %s (%d) at %s", versionString(n.version), n.version, n.path)
	return n
}

// logResult logs what one process measured, phase by phase.
func logResult(t *testing.T, res Result) {
	t.Helper()
	t.Logf("NCCL %s, %d rank(s) in all; this process: ranks %v on GPUs %v, %d MiB each",
		versionString(res.NCCLVersion), res.Ranks, res.Local, res.GPUs, res.Bytes>>20)
	for _, p := range res.Phases {
		if p.Ran() {
			t.Logf("  %-10s ran, data checked: %v per allreduce, algbw %.1f GB/s, busbw %.1f GB/s [%s]", p.Name, p.Time, p.AlgBW, p.BusBW, p.Memory)
		} else {
			t.Logf("  %-10s SKIPPED: %s", p.Name, p.Skipped)
		}
	}
	s := res.Segments
	t.Logf("  segment hooks: registered %d, deregistered %d (by Trim %d, by Close with live buffers %d, by the buffers' Close after it %d), still registered %d, problems %v",
		s.Registered, s.Deregistered, s.ByTrim, s.AtClose, s.AfterClose, s.Live, s.Problems)
}

// checkResult asserts what every run must show: the pool phase ran; the
// registered phase ran where NCCL has ncclCommRegister (2.19), with every
// registered block deregistered exactly once, including those of buffers
// still live when the SubAllocator was closed; the window phase, where
// it ran, gave the right sums (run checked them), and where it did not,
// says why. run and runRank already fail on a wrong element.
func checkResult(t *testing.T, res Result, wantRanks int) {
	t.Helper()
	logResult(t, res)
	if res.Ranks != wantRanks || len(res.Local) == 0 || len(res.Phases) != 3 {
		t.Fatalf("result: %d ranks (want %d), local %v, %d phases (want 3)", res.Ranks, wantRanks, res.Local, len(res.Phases))
	}
	pool := res.Phase("pool")
	if !pool.Ran() || pool.Time <= 0 || pool.AlgBW <= 0 {
		t.Errorf("pool phase: %+v", pool)
	}
	reg := res.Phase("registered")
	switch {
	case res.NCCLVersion >= 21900 && !reg.Ran():
		t.Errorf("registered phase skipped with NCCL %s: %s", versionString(res.NCCLVersion), reg.Skipped)
	case reg.Ran():
		s := res.Segments
		local := len(res.Local)
		if s.Registered < 2*local || s.Registered != s.Deregistered || s.Live != 0 || len(s.Problems) != 0 ||
			s.ByTrim < local || s.AtClose != 0 || s.AfterClose < local {
			t.Errorf("segment hooks over %d local rank(s): %+v", local, s)
		}
	}
	win := res.Phase("window")
	switch {
	case win.Ran():
		t.Logf("window phase: symmetric-memory all-reduce ran and its data was checked")
	case res.NCCLVersion >= verWindows:
		t.Logf("window phase NOT run although NCCL is %s: %s", versionString(res.NCCLVersion), win.Skipped)
	}
	if win.Skipped == "" && !win.Ran() {
		t.Errorf("window phase neither ran nor says why")
	}
}

// GPU: one process all-reduces on every local GPU (ncclCommInitAll), in
// the three phases, and checks every element.
func TestGPUNCCLAllReduce(t *testing.T) {
	devs := cudatest.Devices(t, 1)
	needNCCL(t)
	res, err := run(64<<20, 10, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("one process, %d GPU(s) (of %d found)", res.Ranks, len(devs))
	checkResult(t, res, res.Ranks)
}

// GPU: one process per rank: -ranks 1, and -ranks 2 where there are two
// GPUs (NCCL refuses two ranks on one GPU). The ranks are this test binary
// run again; rank 0 publishes the ncclUniqueId in a file, and each joins
// with ncclCommInitRankScalable.
func TestGPUNCCLMultiProcess(t *testing.T) {
	devs := cudatest.Devices(t, 1)
	n := needNCCL(t)
	if err := n.need("", &n.getUniqueID, &n.commInitRankScalable); err != nil {
		t.Skipf("multi-process mode unavailable: %v", err)
	}
	for _, ranks := range []int{1, 2} {
		t.Run(fmt.Sprintf("ranks=%d", ranks), func(t *testing.T) {
			if ranks > len(devs) {
				t.Skipf("%d ranks need %d GPUs (one per rank); this machine has %d", ranks, ranks, len(devs))
			}
			var out bytes.Buffer
			rs, err := launch(ranks, 32, 5, 3*time.Minute, testStarter(envChild), &out)
			t.Logf("rank processes said:\n%s", out.String())
			if err != nil {
				t.Fatal(err)
			}
			if len(rs) != ranks {
				t.Fatalf("%d results, want %d", len(rs), ranks)
			}
			for i, res := range rs {
				if len(res.Local) != 1 || res.Local[0] != i || res.GPUs[0] != i {
					t.Errorf("result %d: ranks %v on GPUs %v, want rank %d on GPU %d", i, res.Local, res.GPUs, i, i)
				}
				checkResult(t, res, ranks)
			}
			// Every rank ran the same phases (a collective some ranks skip
			// would have hung).
			for _, res := range rs[1:] {
				for j, p := range res.Phases {
					if p.Ran() != rs[0].Phases[j].Ran() {
						t.Errorf("phase %s ran on rank 0: %v, on rank %d: %v", p.Name, rs[0].Phases[j].Ran(), res.Local[0], p.Ran())
					}
				}
			}
		})
	}
}

// GPU: the program itself in the multi-process mode (flags, output).
func TestGPUNCCLMultiProcessMain(t *testing.T) {
	cudatest.Devices(t, 1)
	n := needNCCL(t)
	if err := n.need("", &n.getUniqueID, &n.commInitRankScalable); err != nil {
		t.Skipf("multi-process mode unavailable: %v", err)
	}
	var stdout, stderr bytes.Buffer
	code := realMain([]string{"-ranks", "1", "-mib", "8", "-iters", "3"}, &stdout, &stderr, testStarter(envChild))
	t.Logf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
	if code != 0 {
		t.Fatalf("exit status %d", code)
	}
	for _, want := range []string{"[rank 0] NCCL ", "[rank 0]   pool ", "[rank 0]   registered ", "[rank 0]   window ", "1 rank processes: every element"} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
}

// Bad sizes are refused before anything is opened.
func TestRunRefusesBadSizes(t *testing.T) {
	for _, c := range []struct {
		size  uint64
		iters int
	}{{0, 1}, {6, 1}, {64, 0}} {
		if _, err := run(c.size, c.iters, 0); err == nil {
			t.Errorf("run(%d, %d): no error", c.size, c.iters)
		}
		if _, err := runRank(rankConfig{rank: 0, ranks: 1, idPath: "x", size: c.size, iters: c.iters}); err == nil {
			t.Errorf("runRank(%d, %d): no error", c.size, c.iters)
		}
	}
}

// Bad flags, and flags that contradict each other or apply to another
// mode, are refused before anything is opened: the error and the usage
// on stderr, status 2. -h prints the usage, status 0.
func TestRankFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-rank", "0"}, // no -ranks
		{"-rank", "2", "-ranks", "2", "-id", "x"}, // out of range
		{"-rank", "0", "-ranks", "1"},             // no -id
		{"-device", "0"},                          // a rank's flag without -ranks
		{"-id", "x", "-ranks", "2"},               // -id without -rank
		{"-gpus", "2", "-ranks", "2"},             // the one-process mode's flag with -ranks
		{"-timeout", "1m"},                        // -ranks' flag without it
		{"-mib", "0"},
		{"-iters", "0"},
		{"-no-such-flag"},
		{"extra"},
	} {
		var stdout, stderr bytes.Buffer
		if code := realMain(args, &stdout, &stderr, nil); code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", args, code, stderr.String())
		}
		if first, _, _ := strings.Cut(stderr.String(), "\n"); !strings.HasPrefix(first, "nccl-allreduce: ") ||
			!strings.Contains(stderr.String(), "\nusage: nccl-allreduce") || stdout.Len() > 0 {
			t.Errorf("%v: stdout %q, stderr %q; want the error, then the usage", args, stdout.String(), stderr.String())
		}
	}
	for _, h := range []string{"-h", "-help", "--help"} {
		var stdout, stderr bytes.Buffer
		if code := realMain([]string{h}, &stdout, &stderr, nil); code != 0 || !strings.HasPrefix(stderr.String(), "usage: nccl-allreduce") || stdout.Len() > 0 {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want 0 and the usage on stderr", h, code, stdout.String(), stderr.String())
		}
	}
}

// The id file: published whole and once (a stale one is refused), read
// back by the others, waited for, and its absence reported.
func TestUniqueIDFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "id")
	var id [ncclUniqueIDBytes]byte
	for i := range id {
		id[i] = byte(i*7 + 1)
	}
	got := make(chan error, 1)
	go func() {
		g, err := awaitID(path, 10*time.Second)
		if err == nil && g != id {
			err = fmt.Errorf("read %x, want %x", g, id)
		}
		got <- err
	}()
	time.Sleep(50 * time.Millisecond) // the reader waits for it
	if err := publishID(path, id); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm()&0o077 != 0 {
		t.Errorf("id file: %v, mode %v; want private to its owner", err, st.Mode())
	}
	if err := publishID(path, id); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("publishing over an existing id: %v, want refused", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d files left in the directory, want the id only", len(ents))
	}
	if _, err := awaitID(filepath.Join(dir, "none"), 100*time.Millisecond); err == nil || !strings.Contains(err.Error(), "is rank 0 running") {
		t.Errorf("waiting for no id: %v", err)
	}
	short := filepath.Join(dir, "short")
	if err := os.WriteFile(short, []byte("abc"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := awaitID(short, time.Second); err == nil {
		t.Error("a 3-byte id was accepted")
	}
}

// fakeRank plays a rank process for TestSpawn: "ok" reports a Result;
// "fail" fails on rank 1 and hangs on the others, as ranks waiting in
// NCCL for a dead peer do; "hang" hangs.
func fakeRank(mode string) int {
	var args []string
	_ = json.Unmarshal([]byte(os.Getenv(envFake+"_ARGS")), &args)
	r := -1
	for i, a := range args {
		if a == "-rank" && i+1 < len(args) {
			r, _ = strconv.Atoi(args[i+1])
		}
	}
	switch {
	case mode == "ok":
		fmt.Printf("hello from rank %d\n", r)
		j, _ := json.Marshal(Result{Ranks: 3, Local: []int{r}, GPUs: []int{r}})
		fmt.Printf("%s%s\n", resultPrefix, j)
		return 0
	case mode == "fail" && r == 1:
		fmt.Fprintln(os.Stderr, "nccl-allreduce: rank 1 broke")
		return 1
	}
	time.Sleep(time.Minute)
	return 0
}

func fakeStarter(mode string) starter {
	return func(args []string) (*exec.Cmd, error) {
		j, _ := json.Marshal(args)
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envFake+"="+mode, envFake+"_ARGS="+string(j))
		return cmd, nil
	}
}

// spawn, on the CPU: results collected by rank and output prefixed; a
// failed rank gets the others killed and is named; a hang is ended by the
// timeout.
func TestSpawn(t *testing.T) {
	args := func(i int) []string { return []string{"-rank", strconv.Itoa(i)} }
	var out bytes.Buffer
	rs, err := spawn(3, args, time.Minute, fakeStarter("ok"), &out)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 3 || rs[0].Local[0] != 0 || rs[2].Local[0] != 2 {
		t.Errorf("results %+v", rs)
	}
	for i := range 3 {
		if want := fmt.Sprintf("[rank %d] hello from rank %d\n", i, i); !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), resultPrefix) {
		t.Errorf("result lines copied to the output:\n%s", out.String())
	}

	start := time.Now()
	out.Reset()
	_, err = spawn(3, args, time.Minute, fakeStarter("fail"), &out)
	if err == nil || !strings.Contains(err.Error(), "rank 1: exit status 1: nccl-allreduce: rank 1 broke") {
		t.Errorf("a failed rank: %v", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the other ranks were not killed: %v", d)
	}

	start = time.Now()
	_, err = spawn(2, args, 500*time.Millisecond, fakeStarter("hang"), &out)
	if err == nil || !strings.Contains(err.Error(), "not done after 500ms; killed") {
		t.Errorf("hanging ranks: %v", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("the timeout did not end the ranks: %v", d)
	}
}

// Without a driver, -ranks says so once, before starting anything.
func TestLaunchWithoutDriver(t *testing.T) {
	if _, err := cuda.Devices(); err == nil {
		t.Skip("a driver is here")
	}
	started := false
	_, err := launch(2, 1, 1, time.Minute, func([]string) (*exec.Cmd, error) { started = true; return nil, errors.New("no") }, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "no CUDA driver") || started {
		t.Errorf("launch without a driver: %v (started a rank: %v)", err, started)
	}
}

// Without a driver, each mode says so in one line that names the path
// tried and says "CUDA driver" once (no prefix repeating the error).
func TestNoDriverOneLine(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	missing := filepath.Join(dir, "no-such-libcuda.so.1")
	for _, args := range [][]string{{}, {"-ranks", "2"}, {"-ranks", "2", "-rank", "1", "-id", filepath.Join(dir, "id")}} {
		j, err := json.Marshal(args)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), envChild+"="+string(j), "CUDAMEM_DRIVER="+missing)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err = cmd.Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			t.Errorf("%q: %v, want status 1 (stderr %q)", args, err, stderr.String())
			continue
		}
		msg := stderr.String()
		if !strings.HasPrefix(msg, "nccl-allreduce: ") || strings.Count(msg, "\n") != 1 ||
			strings.Count(msg, "CUDA driver") != 1 || !strings.Contains(msg, missing) || stdout.Len() > 0 {
			t.Errorf("%q: stdout %q, stderr %q; want one line naming %s, saying \"CUDA driver\" once", args, stdout.String(), msg, missing)
		}
	}
}
