package buffer_test

import (
	"testing"
	"time"

	"github.com/cudamem/cudamem/cuda"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// panicked runs f and returns what it panicked with (nil if it returned).
func panicked(f func()) (v any) {
	defer func() { v = recover() }()
	f()
	return nil
}

// within fails the test if f does not return within a generous bound: a
// regression that wedges a Buffer must fail, not hang the suite.
func within(t *testing.T, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); f() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not return: a panicking free left the buffer wedged", what)
	}
}

// TestCloseAfterPanickingFree: a resource whose Deallocate panics makes
// Close panic, but leaves the buffer open and usable, so that the next
// Close frees it.
func TestCloseAfterPanickingFree(t *testing.T) {
	m := newFake()
	b := m.alloc(64)
	m.panicFrees = 1
	assert.Equal(t, errFakePanic, panicked(func() { _ = b.Close() }), "the resource's panic propagates")
	assert.False(t, b.IsClosed(), "nothing was freed: the buffer is open")
	within(t, "Use after the panic", func() { assert.NoError(t, b.Use("test", func(cuda.DevicePtr) error { return nil })) })
	within(t, "Close after the panic", func() { require.NoError(t, b.Close()) })
	assert.True(t, b.IsClosed())
	assert.Equal(t, 0, m.liveCount(), "the second Close freed the memory")
}

// TestHoldReleaseAfterPanickingFree: the last Release's free panics; the
// hold stays live, and a later Release frees.
func TestHoldReleaseAfterPanickingFree(t *testing.T) {
	m := newFake()
	b := m.alloc(64)
	h, err := b.Hold("test")
	require.NoError(t, err)
	require.NoError(t, b.Close())
	m.panicFrees = 1
	assert.Equal(t, errFakePanic, panicked(func() { _ = h.Release() }))
	assert.Equal(t, 1, m.liveCount(), "nothing was freed")
	within(t, "Release after the panic", func() { require.NoError(t, h.Release()) })
	assert.Equal(t, 0, m.liveCount(), "the second Release freed the memory")
	require.NoError(t, h.Release(), "Release is idempotent once it freed")
	assert.Equal(t, 0, m.liveCount())
}
