package buffer_test

import (
	"fmt"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
)

// A leaked buffer whose free fails in the safety net (on the finalizer's
// goroutine, where no caller waits for the error) is logged at Warn,
// naming the operation, the address and size, and the resource's error;
// one freed cleanly logs nothing.
func TestSafetyNetLogsFailedFree(t *testing.T) {
	log := testutil.CaptureSlog(t, slog.LevelWarn)
	fake := newFake()
	p, _, err := fake.AllocatePtr(64, nil)
	require.NoError(t, err)
	buffer.CollectOne(fake, p, 64, nil)
	expectedLeaks.Add(1)
	assert.Empty(t, log.Lines(), "a free that worked")

	p, _, err = fake.AllocatePtr(64, nil)
	require.NoError(t, err)
	fake.mu.Lock()
	fake.failFrees = 1
	fake.mu.Unlock()
	buffer.CollectOne(fake, p, 64, nil)
	expectedLeaks.Add(1)
	lines := log.Lines()
	require.Len(t, lines, 1)
	for _, want := range []string{"level=WARN", `msg="cudamem: background release failed"`,
		`op="Buffer safety net: Deallocate"`, fmt.Sprintf("addr=%#x", uint64(p)), "size=64", errFakeFree.Error()} {
		assert.Contains(t, lines[0], want)
	}
	assert.Equal(t, 1, fake.liveCount(), "the memory it could not free")
	require.NoError(t, fake.Deallocate(p, 64, nil))
}
