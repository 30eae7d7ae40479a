package resource

// CPU tests of user code that panics under the adaptors (an upstream, a
// fallback, a log handler): the panic reaches the caller, and the books
// stay as if the call had failed, so that nothing is lost and no count
// stays raised.

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An upstream that panics in AllocatePtr does not keep the bytes the
// Limiting reserved for it: the whole budget is there afterwards.
func TestLimitingUpstreamPanics(t *testing.T) {
	up := &panickyUpstream{saUpstream: newSAUpstream()}
	r := NewLimiting(up, saMiB)
	up.alloc.Store(true)
	mustPanic(t, "AllocatePtr", func() { _, _, _ = r.AllocatePtr(saMiB, nil) })
	up.alloc.Store(false)
	assert.Zero(t, r.Used(), "the reservation was given back")
	p, _, err := r.AllocatePtr(saMiB, nil)
	require.NoError(t, err, "the whole budget")
	require.NoError(t, r.Deallocate(p, saMiB, nil))
	assert.Zero(t, r.Used())
}

// An upstream whose Deallocate panics leaves the allocation on the
// Tracking's books (as a failed free does), so that a retried free is
// accepted and passed on.
func TestTrackingUpstreamFreePanics(t *testing.T) {
	up := &panickyUpstream{saUpstream: newSAUpstream()}
	r := NewTracking(up, nil)
	p, _, err := r.AllocatePtr(saKiB, nil)
	require.NoError(t, err)
	up.free.Store(true)
	mustPanic(t, "Deallocate", func() { _ = r.Deallocate(p, saKiB, nil) })
	up.free.Store(false)
	assert.Equal(t, 1, r.LiveCount(), "still live")
	assert.Equal(t, uint64(saKiB), r.LiveBytes())
	require.NoError(t, r.Deallocate(p, saKiB, nil), "the retried free")
	assert.Zero(t, r.LiveCount())
	_, _, live := up.counts()
	assert.Zero(t, live)
}

// A fallback whose Deallocate panics keeps the address as the fallback's,
// so that the retried free goes to the fallback again, not to the
// primary.
func TestFallbackFreePanics(t *testing.T) {
	primary := newSAUpstream()
	primary.limit = saKiB // refuses what follows
	alt := &panickyUpstream{saUpstream: newSAUpstream()}
	f := NewFallback(primary, alt)
	p, _, err := f.AllocatePtr(saMiB, nil)
	require.NoError(t, err)
	require.Equal(t, 1, f.LiveFallbacks())
	alt.free.Store(true)
	mustPanic(t, "Deallocate", func() { _ = f.Deallocate(p, saMiB, nil) })
	alt.free.Store(false)
	assert.Equal(t, 1, f.LiveFallbacks(), "still the fallback's")
	require.NoError(t, f.Deallocate(p, saMiB, nil))
	assert.Zero(t, f.LiveFallbacks())
	_, _, live := alt.counts()
	assert.Zero(t, live, "the fallback got it back")
	_, frees, _ := primary.counts()
	assert.Zero(t, frees, "the primary was never asked")
}

// panicHandler is a slog handler that panics on every record.
type panicHandler struct{}

func (panicHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (panicHandler) Handle(context.Context, slog.Record) error { panic(userPanic("Handle")) }
func (h panicHandler) WithAttrs([]slog.Attr) slog.Handler      { return h }
func (h panicHandler) WithGroup(string) slog.Handler           { return h }

// A log handler that panics while Logging records an allocation: the
// memory, which would reach no caller, goes back to the upstream.
func TestLoggingHandlerPanics(t *testing.T) {
	up := newSAUpstream()
	r := NewLogging(up, slog.New(panicHandler{}), nil)
	mustPanic(t, "Handle", func() { _, _, _ = r.AllocatePtr(saKiB, nil) })
	allocs, frees, live := up.counts()
	assert.Equal(t, 1, allocs)
	assert.Equal(t, 1, frees)
	assert.Zero(t, live, "the allocation went back")
	// Nothing for a failed allocation: the handler still sees it.
	up.limit = 1
	mustPanic(t, "Handle", func() { _, _, _ = r.AllocatePtr(saKiB, nil) })
	_, frees, _ = up.counts()
	assert.Equal(t, 1, frees)
}
