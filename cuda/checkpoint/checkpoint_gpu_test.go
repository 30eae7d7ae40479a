//go:build linux

package checkpoint_test

// GPU tests: a child process (this test binary, TestCheckpointChild) holds
// cudamem memory with a known pattern; the test checkpoints and restores
// it, and the child checks its data on the device afterwards. Where the
// driver or the machine cannot checkpoint (calls missing, not supported,
// not permitted), the tests skip with the driver's own error.

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/cuda/checkpoint"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/virtual"
)

const (
	envChild  = "CUDAMEM_CHECKPOINT_CHILD" // the device ordinal the child uses
	childSize = 8 << 20
	seed      = 61
	ready     = "CHECKPOINT-CHILD READY"
	done      = "CHECKPOINT-CHILD DONE"
	// childBound is how long a child may live: see startTarget.
	childBound = 3 * time.Minute
)

// target is a running child holding memory, waiting for "check" on its
// stdin.
type target struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
	log   strings.Builder // what the child printed
	p     checkpoint.Process
}

// startTarget starts the child on device ordinal dev and waits until its
// memory holds the pattern. The child is killed when the test ends if it
// has not exited by then.
func startTarget(t *testing.T, dev int) *target {
	t.Helper()
	tg := &target{cmd: exec.Command(os.Args[0], "-test.run=^TestCheckpointChild$", "-test.v", "-test.count=1", "-test.timeout=5m")}
	tg.cmd.Env = append(os.Environ(), envChild+"="+strconv.Itoa(dev))
	var err error
	tg.stdin, err = tg.cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := tg.cmd.StdoutPipe()
	require.NoError(t, err)
	tg.cmd.Stderr = tg.cmd.Stdout
	tg.out = bufio.NewReader(stdout)
	require.NoError(t, tg.cmd.Start())
	t.Cleanup(func() {
		if tg.cmd.ProcessState == nil {
			_ = tg.cmd.Process.Kill()
			_ = tg.cmd.Wait()
		}
	})
	tg.p = checkpoint.Process{PID: tg.cmd.Process.Pid}
	// A driver call that never returns would hang the test binary: past
	// this bound the child is killed, which ends any wait on it, and the
	// test fails on the error that follows. It bounds a hang; it asserts
	// nothing about time.
	watchdog := time.AfterFunc(childBound, func() {
		fmt.Fprintf(os.Stderr, "checkpoint test: %v not done after %v: killing it\n", tg.p, childBound)
		_ = tg.cmd.Process.Kill()
	})
	t.Cleanup(func() { watchdog.Stop() })
	tg.waitFor(t, ready)
	return tg
}

// waitFor reads the child's output up to a line starting with prefix.
func (tg *target) waitFor(t *testing.T, prefix string) {
	t.Helper()
	for {
		line, err := tg.out.ReadString('\n')
		tg.log.WriteString(line)
		if strings.HasPrefix(line, prefix) {
			return
		}
		if err != nil {
			require.NoError(t, tg.cmd.Wait(), "the child exited before %q:\n%s", prefix, tg.log.String())
			t.Fatalf("the child exited before %q:\n%s", prefix, tg.log.String())
		}
	}
}

// finish has the child check its memory, rewrite and check it again, and
// exit; the test fails unless it passed.
func (tg *target) finish(t *testing.T) {
	t.Helper()
	_, err := io.WriteString(tg.stdin, "check\n")
	require.NoError(t, err)
	tg.waitFor(t, done)
	rest, _ := io.ReadAll(tg.out)
	tg.log.Write(rest)
	require.NoError(t, tg.cmd.Wait(), "the child:\n%s", tg.log.String())
	require.Contains(t, tg.log.String(), "--- PASS: TestCheckpointChild", "the child:\n%s", tg.log.String())
}

// skipIfUnavailable skips the test when err says this driver or machine
// cannot checkpoint (the calls missing, CUDA_ERROR_NOT_SUPPORTED,
// CUDA_ERROR_NOT_PERMITTED, or CUDA_ERROR_OPERATING_SYSTEM: the system
// refused), printing the driver's error; the child is killed by
// startTarget's cleanup.
func skipIfUnavailable(t *testing.T, err error) {
	t.Helper()
	const errorOperatingSystem = cuda.Result(304) // CUDA_ERROR_OPERATING_SYSTEM
	if errors.Is(err, cuda.ErrNotSupported) || errors.Is(err, cuda.ErrorNotPermitted) || errors.Is(err, errorOperatingSystem) {
		t.Skipf("process checkpoints unavailable here: %v", err)
	}
}

// cycle locks, checkpoints, restores (with opts) and unlocks the target,
// checking the state at each step. A refused remapping restore is undone
// (restored in place, unlocked) before the error is returned.
func cycle(t *testing.T, tg *target, opts *checkpoint.RestoreOptions) error {
	t.Helper()
	p := tg.p
	state := func(want checkpoint.State) {
		t.Helper()
		s, err := p.State()
		require.NoError(t, err)
		require.Equal(t, want, s, "state of %v", p)
	}
	state(cuda.ProcessRunning)
	err := p.Lock(30 * time.Second)
	skipIfUnavailable(t, err)
	require.NoError(t, err)
	state(cuda.ProcessLocked)
	err = p.Checkpoint()
	if err != nil {
		assert.NoError(t, p.Unlock(), "unlock after the refused checkpoint")
	}
	skipIfUnavailable(t, err)
	require.NoError(t, err)
	state(cuda.ProcessCheckpointed)
	if err := p.Restore(opts); err != nil {
		require.NoError(t, p.Restore(nil), "restore in place after %v", err)
		require.NoError(t, p.Unlock())
		return err
	}
	state(cuda.ProcessLocked)
	require.NoError(t, p.Unlock())
	state(cuda.ProcessRunning)
	return nil
}

// TestCheckpointRoundTrip: a child holding a device pool buffer and a
// virtual memory buffer, both with a pattern, is locked, checkpointed
// (its device memory released), restored and unlocked; the child then
// finds the pattern in both on the device, and the device works on.
func TestCheckpointRoundTrip(t *testing.T) {
	cudatest.Device(t)
	tg := startTarget(t, 0)
	tid, err := tg.p.RestoreThreadID()
	skipIfUnavailable(t, err)
	require.NoError(t, err)
	assert.Positive(t, tid, "restore thread")
	require.NoError(t, cycle(t, tg, nil))
	tg.finish(t)
}

// TestCheckpointOutOfOrder: the driver refuses each call made in the
// wrong state with CUDA_ERROR_ILLEGAL_STATE, as its documentation says
// (and the fake driver models), leaving the state as it was; the child's
// data is intact afterwards.
func TestCheckpointOutOfOrder(t *testing.T) {
	cudatest.Device(t)
	tg := startTarget(t, 0)
	p := tg.p
	illegal := func(op string, err error, in checkpoint.State) {
		t.Helper()
		skipIfUnavailable(t, err)
		require.ErrorIs(t, err, cuda.ErrorIllegalState, "%s while %v", op, in)
		assert.Contains(t, err.Error(), fmt.Sprintf("Process.%s: pid %d: ", op, p.PID))
		s, err := p.State()
		require.NoError(t, err)
		require.Equal(t, in, s, "the state after a refused %s", op)
	}
	illegal("Checkpoint", p.Checkpoint(), cuda.ProcessRunning)
	illegal("Unlock", p.Unlock(), cuda.ProcessRunning)
	illegal("Restore", p.Restore(nil), cuda.ProcessRunning)
	err := p.Lock(30 * time.Second)
	skipIfUnavailable(t, err)
	require.NoError(t, err)
	illegal("Lock", p.Lock(time.Second), cuda.ProcessLocked)
	illegal("Restore", p.Restore(nil), cuda.ProcessLocked)
	require.NoError(t, p.Unlock())
	tg.finish(t)
}

// TestCheckpointRestoreRemap restores onto the same GPUs through the
// remapping path: every GPU of the machine mapped onto itself, as the
// driver asks of a remapping. A driver that refuses remapping here
// (CUDA_ERROR_INVALID_VALUE on some hardware) or lacks it makes the test
// skip with its error, after restoring in place.
func TestCheckpointRestoreRemap(t *testing.T) {
	ds := cudatest.Devices(t, 1)
	if v := os.Getenv("CUDA_VISIBLE_DEVICES"); v != "" {
		t.Skipf("CUDA_VISIBLE_DEVICES=%s hides GPUs the remapping must name", v)
	}
	all, err := cuda.Devices()
	require.NoError(t, err)
	gpus := map[cuda.UUID]cuda.UUID{}
	for _, d := range all {
		u, err := d.UUID()
		require.NoError(t, err)
		gpus[u] = u
	}
	tg := startTarget(t, ds[0].Ordinal())
	err = cycle(t, tg, &checkpoint.RestoreOptions{GPUs: gpus})
	if errors.Is(err, cuda.ErrorInvalidValue) || errors.Is(err, cuda.ErrNotSupported) {
		tg.finish(t) // restored in place: the data is still checked
		t.Skipf("remapping restore refused here: %v", err)
	}
	require.NoError(t, err)
	tg.finish(t)
}

// TestCheckpointSwapGPUs moves a child from one GPU to another of the same
// chip (the two swapped in the mapping); its memory reads back intact on
// the new GPU.
func TestCheckpointSwapGPUs(t *testing.T) {
	cudatest.Devices(t, 2)
	if v := os.Getenv("CUDA_VISIBLE_DEVICES"); v != "" {
		t.Skipf("CUDA_VISIBLE_DEVICES=%s hides GPUs the remapping must name", v)
	}
	all, err := cuda.Devices()
	require.NoError(t, err)
	gpus := map[cuda.UUID]cuda.UUID{}
	var uuids []cuda.UUID
	names := map[string]int{}
	pair := [2]int{-1, -1}
	for i, d := range all {
		u, err := d.UUID()
		require.NoError(t, err)
		gpus[u] = u
		uuids = append(uuids, u)
		name, err := d.Name()
		require.NoError(t, err)
		if j, ok := names[name]; ok && pair[0] < 0 {
			pair = [2]int{j, i}
		}
		names[name] = i
	}
	if pair[0] < 0 {
		t.Skip("no two GPUs of the same chip")
	}
	a, b := uuids[pair[0]], uuids[pair[1]]
	gpus[a], gpus[b] = b, a
	tg := startTarget(t, pair[0])
	err = cycle(t, tg, &checkpoint.RestoreOptions{GPUs: gpus})
	if errors.Is(err, cuda.ErrorInvalidValue) || errors.Is(err, cuda.ErrNotSupported) {
		tg.finish(t)
		t.Skipf("GPU migration refused here: %v", err)
	}
	require.NoError(t, err)
	tg.finish(t)
}

// The GPU tests' flow over the fake driver's two devices (in a child
// process: the fake keeps the state machine; nothing is really copied, and
// the child's own data check runs against its own fake).
func TestCheckpointOnFakeDriver(t *testing.T) {
	fakecuda.RunOnTwoDevices(t, "TestCheckpointRoundTrip", "TestCheckpointOutOfOrder", "TestCheckpointRestoreRemap")
}

// TestCheckpointChild is the target process: it holds memory with the
// pattern, says so, waits for "check", and then checks, rewrites and
// checks it again on the device.
func TestCheckpointChild(t *testing.T) {
	v := os.Getenv(envChild)
	if v == "" {
		t.Skip("run as a child process by the checkpoint tests")
	}
	ord, err := strconv.Atoi(v)
	require.NoError(t, err)
	d := cudatest.Devices(t, ord+1)[ord]
	s := cudatest.Stream(t, d)
	k := cudatest.LoadKernels(t, d)
	pool, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{})
	require.NoError(t, err)
	defer func() { assert.NoError(t, pool.Close()) }()
	bufs := []*buffer.Buffer{}
	b, err := pool.Allocate(childSize, s)
	require.NoError(t, err)
	bufs = append(bufs, b)
	if vr, err := virtual.New(d, nil); err == nil {
		vb, err := vr.Allocate(childSize, s)
		require.NoError(t, err)
		bufs = append(bufs, vb)
		defer func() { assert.Empty(t, vr.Live(), "every virtual allocation freed") }()
	} else {
		t.Logf("no virtual memory buffer: %v", err)
	}
	for i, b := range bufs {
		require.NoError(t, k.Write(s, b.Ptr(), b.Size(), seed+uint32(i)))
	}
	require.NoError(t, s.Sync())
	fmt.Println(ready)
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "check\n", line)
	for i, b := range bufs {
		k.RequireCheck(t, s, b.Ptr(), b.Size(), seed+uint32(i))
		require.NoError(t, k.Write(s, b.Ptr(), b.Size(), seed+10+uint32(i)))
		k.RequireCheck(t, s, b.Ptr(), b.Size(), seed+10+uint32(i))
	}
	for _, b := range bufs {
		require.NoError(t, b.Close())
	}
	require.NoError(t, s.Sync())
	fmt.Println(done)
}
