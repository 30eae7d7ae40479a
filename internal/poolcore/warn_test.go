package poolcore

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/cudamem/cudamem/internal/testkit/testutil"
)

// A destruction that fails where no caller sees it (the last free of a
// closed pool, a retry after a capture) is logged at Warn, naming the pool
// and the error; a Close, which returns it, logs nothing.
func TestDeferredDestroyFailureWarns(t *testing.T) {
	log := testutil.CaptureSlog(t, slog.LevelWarn)
	var c Core
	var d destroyer
	c.SetDestroy(d.fn)
	c.SetName(func() string { return "DevicePool 0x1234 on GPU 0" })
	if !c.Enter() {
		t.Fatal("Enter failed")
	}
	c.Allocated()
	c.Leave()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	d.fail.Store(2)
	if err := c.Freed(); err == nil {
		t.Fatal("the failed destruction was not returned")
	}
	if err := c.Retry(); err == nil {
		t.Fatal("the failed retry was not returned")
	}
	lines := log.Lines()
	if len(lines) != 2 {
		t.Fatalf("want 2 warnings (Freed's, Retry's), got %q", lines)
	}
	for _, l := range lines {
		for _, want := range []string{"level=WARN", `op="deferred pool destruction"`, `pool="DevicePool 0x1234 on GPU 0"`, `err="destroy failed"`} {
			if !strings.Contains(l, want) {
				t.Errorf("%q lacks %q", l, want)
			}
		}
	}
	d.fail.Store(1)
	if err := c.Close(); err == nil || c.IsDestroyed() {
		t.Fatalf("Close's retry fails: %v, destroyed %v", err, c.IsDestroyed())
	}
	if n := len(log.Lines()); n != 2 {
		t.Errorf("Close, which returns its error, logged: %d lines", n)
	}
	if err := c.Close(); err != nil || !c.IsDestroyed() {
		t.Fatalf("the next Close retries: %v, destroyed %v", err, c.IsDestroyed())
	}
	if n := len(log.Lines()); n != 2 {
		t.Errorf("a destruction that succeeds logged: %d lines", n)
	}
}

// The pool's name is built for a warning only: a destruction that
// succeeds, or is deferred, never asks for it.
func TestDeferredDestroyNameOnlyForWarnings(t *testing.T) {
	var c Core
	var d destroyer
	named := 0
	c.SetDestroy(d.fn)
	c.SetName(func() string { named++; return "pool" })
	if !c.Enter() {
		t.Fatal("Enter failed")
	}
	c.Allocated()
	c.Leave()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Freed(); err != nil || !c.IsDestroyed() {
		t.Fatalf("Freed destroys: %v, destroyed %v", err, c.IsDestroyed())
	}
	if named != 0 {
		t.Errorf("the name was built %d times for a destruction that succeeded", named)
	}
}
