package checkpoint_test

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/cuda/checkpoint"
)

// Bad arguments are refused before the driver (these run without one),
// each error naming the method, the pid and the value.
func TestProcessRefusesBadArguments(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		call       func() error
	}{
		{"zero pid", "Process.Lock: pid 0: cuCheckpointProcessLock", func() error { return checkpoint.Process{}.Lock(0) }},
		{"negative pid", "Process.Unlock: pid -5", func() error { return checkpoint.Process{PID: -5}.Unlock() }},
		{"pid past a C int", "Process.Checkpoint: pid 2147483648", func() error {
			pid := math.MaxInt32
			pid++ // a 32-bit int wraps to a negative pid
			return checkpoint.Process{PID: pid}.Checkpoint()
		}},
		{"state of pid 0", "Process.State: pid 0", func() error { _, err := checkpoint.Process{}.State(); return err }},
		{"restore thread of pid 0", "Process.RestoreThreadID: pid 0", func() error { _, err := checkpoint.Process{}.RestoreThreadID(); return err }},
		{"restore of pid 0", "Process.Restore: pid 0", func() error { return checkpoint.Process{}.Restore(nil) }},
		{"negative timeout", "timeout -1ms", func() error { return checkpoint.Process{PID: 1}.Lock(-time.Millisecond) }},
		{"timeout past 2^32-1 ms", "timeout 1193h2m47.296s", func() error {
			return checkpoint.Process{PID: 1}.Lock((math.MaxUint32 + 1) * time.Millisecond)
		}},
		{"zero old UUID", "zero UUID", func() error {
			return checkpoint.Process{PID: 1}.Restore(&checkpoint.RestoreOptions{GPUs: map[cuda.UUID]cuda.UUID{{}: {1}}})
		}},
		{"zero new UUID", "zero UUID", func() error {
			return checkpoint.Process{PID: 1}.Restore(&checkpoint.RestoreOptions{GPUs: map[cuda.UUID]cuda.UUID{{1}: {}}})
		}},
		{"two GPUs onto one", "is the target of both", func() error {
			return checkpoint.Process{PID: 1}.Restore(&checkpoint.RestoreOptions{GPUs: map[cuda.UUID]cuda.UUID{{1}: {3}, {2}: {3}}})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.call()
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			if tc.name == "pid past a C int" && math.MaxInt == math.MaxInt32 {
				return
			}
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestProcessString(t *testing.T) {
	assert.Equal(t, "process 42", checkpoint.Process{PID: 42}.String())
	assert.Equal(t, "locked", checkpoint.State(cuda.ProcessLocked).String())
}
