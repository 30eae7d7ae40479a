//go:build linux

package checkpoint_test

// CPU tests over the fake driver (internal/testkit/fakecuda), each in a
// child process: the fake keeps a checkpoint state machine per process id
// and checks the restore's GPU pairs against its devices' UUIDs.

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/cuda/checkpoint"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
)

// fakeUUIDs returns the fake's devices' UUIDs.
func fakeUUIDs(t *testing.T) []cuda.UUID {
	t.Helper()
	ds, err := cuda.Devices()
	require.NoError(t, err)
	var out []cuda.UUID
	for _, d := range ds {
		u, err := d.UUID()
		require.NoError(t, err)
		out = append(out, u)
	}
	return out
}

// The driver's state machine, walked forwards, and every call out of order
// refused with the driver's CUDA_ERROR_ILLEGAL_STATE, naming the method
// and the pid, the state unchanged.
func TestProcessStateMachineFake(t *testing.T) {
	if !fakecuda.OnFake(t, "FAKECUDA_DEVICES=2") {
		return
	}
	p := checkpoint.Process{PID: os.Getpid()}
	state := func(want checkpoint.State) {
		t.Helper()
		s, err := p.State()
		require.NoError(t, err)
		require.Equal(t, want, s)
	}
	illegal := func(op string, err error, in checkpoint.State) {
		t.Helper()
		require.ErrorIs(t, err, cuda.ErrorIllegalState, "%s while %v", op, in)
		assert.Contains(t, err.Error(), "Process."+op+": pid ")
		state(in)
	}
	state(cuda.ProcessRunning)
	tid, err := p.RestoreThreadID()
	require.NoError(t, err)
	assert.Positive(t, tid)

	illegal("Checkpoint", p.Checkpoint(), cuda.ProcessRunning)
	illegal("Restore", p.Restore(nil), cuda.ProcessRunning)
	illegal("Unlock", p.Unlock(), cuda.ProcessRunning)
	require.NoError(t, p.Lock(5*time.Second))
	state(cuda.ProcessLocked)
	illegal("Lock", p.Lock(0), cuda.ProcessLocked)
	illegal("Restore", p.Restore(nil), cuda.ProcessLocked)
	require.NoError(t, p.Checkpoint())
	state(cuda.ProcessCheckpointed)
	illegal("Lock", p.Lock(0), cuda.ProcessCheckpointed)
	illegal("Checkpoint", p.Checkpoint(), cuda.ProcessCheckpointed)
	illegal("Unlock", p.Unlock(), cuda.ProcessCheckpointed)
	require.NoError(t, p.Restore(nil))
	state(cuda.ProcessLocked)
	require.NoError(t, p.Unlock())
	state(cuda.ProcessRunning)

	// A sub-millisecond timeout is taken (as 1 ms: TestLockMs).
	require.NoError(t, p.Lock(time.Nanosecond))
	require.NoError(t, p.Unlock())
}

// Restore's GPU pairs reach the driver as the header lays them out: the
// fake takes a mapping of all its devices (swapped, or each onto itself)
// and refuses one that leaves a device out or names a GPU it lacks, with
// the driver's CUDA_ERROR_INVALID_VALUE.
func TestProcessRestoreRemapFake(t *testing.T) {
	if !fakecuda.OnFake(t, "FAKECUDA_DEVICES=2") {
		return
	}
	u := fakeUUIDs(t)
	require.Len(t, u, 2)
	p := checkpoint.Process{PID: os.Getpid()}
	cycle := func(gpus map[cuda.UUID]cuda.UUID) error {
		t.Helper()
		require.NoError(t, p.Lock(0))
		require.NoError(t, p.Checkpoint())
		err := p.Restore(&checkpoint.RestoreOptions{GPUs: gpus})
		if err != nil {
			require.NoError(t, p.Restore(nil), "a refused restore leaves the process checkpointed")
		}
		require.NoError(t, p.Unlock())
		return err
	}
	require.NoError(t, cycle(map[cuda.UUID]cuda.UUID{u[0]: u[1], u[1]: u[0]}), "swapped")
	require.NoError(t, cycle(map[cuda.UUID]cuda.UUID{u[0]: u[0], u[1]: u[1]}), "each onto itself")
	err := cycle(map[cuda.UUID]cuda.UUID{u[0]: u[1]})
	require.ErrorIs(t, err, cuda.ErrorInvalidValue, "device 1 left out")
	assert.Contains(t, err.Error(), "Process.Restore: pid ")
	assert.Contains(t, err.Error(), "cuCheckpointProcessRestore")
	require.ErrorIs(t, cycle(map[cuda.UUID]cuda.UUID{u[0]: u[0], u[1]: {0xaa}}), cuda.ErrorInvalidValue, "a GPU the driver lacks")
}

// A pid no live process has: the driver's CUDA_ERROR_INVALID_VALUE.
func TestProcessGoneFake(t *testing.T) {
	if !fakecuda.OnFake(t) {
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	require.NoError(t, cmd.Run())
	p := checkpoint.Process{PID: cmd.Process.Pid} // exited and reaped
	_, err := p.State()
	require.ErrorIs(t, err, cuda.ErrorInvalidValue)
	assert.ErrorIs(t, p.Lock(0), cuda.ErrorInvalidValue)
}

// A driver older than CUDA 12.8 lacks the calls: each method says so,
// naming the entry point, and matches cuda.ErrNotSupported.
func TestProcessNotSupportedFake(t *testing.T) {
	if !fakecuda.OnFake(t, "FAKECUDA_VERSION=12070") {
		return
	}
	missing, err := cuda.DriverMissing()
	require.NoError(t, err)
	assert.Contains(t, missing, "cuCheckpointProcessLock")
	p := checkpoint.Process{PID: os.Getpid()}
	_, serr := p.State()
	_, terr := p.RestoreThreadID()
	for name, err := range map[string]error{
		"cuCheckpointProcessLock":               p.Lock(0),
		"cuCheckpointProcessCheckpoint":         p.Checkpoint(),
		"cuCheckpointProcessRestore":            p.Restore(nil),
		"cuCheckpointProcessUnlock":             p.Unlock(),
		"cuCheckpointProcessGetState":           serr,
		"cuCheckpointProcessGetRestoreThreadId": terr,
	} {
		require.ErrorIs(t, err, cuda.ErrNotSupported, name)
		assert.Contains(t, err.Error(), "does not provide "+name)
		assert.Contains(t, err.Error(), "pid ")
	}
}

// A CUDA 12.8 driver has the calls but not restore's GPU remapping (13.0):
// pairs are refused before the call, the process left checkpointed.
func TestProcessRemapNeedsCUDA13Fake(t *testing.T) {
	if !fakecuda.OnFake(t, "FAKECUDA_VERSION=12080") {
		return
	}
	p := checkpoint.Process{PID: os.Getpid()}
	require.NoError(t, p.Lock(0))
	require.NoError(t, p.Checkpoint())
	u := fakeUUIDs(t)
	err := p.Restore(&checkpoint.RestoreOptions{GPUs: map[cuda.UUID]cuda.UUID{u[0]: u[0]}})
	require.ErrorIs(t, err, cuda.ErrNotSupported)
	assert.Contains(t, err.Error(), "needs a CUDA 13.0 driver, this one is 12.8")
	s, err := p.State()
	require.NoError(t, err)
	assert.Equal(t, cuda.ProcessCheckpointed, s)
	require.NoError(t, p.Restore(nil))
	require.NoError(t, p.Unlock())
}
