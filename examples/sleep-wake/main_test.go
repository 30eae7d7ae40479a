package main

import (
	"strings"
	"testing"

	"github.com/cudamem/cudamem/examples/internal/extest"
)

func TestMain(m *testing.M) { extest.Main(m, main) }

// -h prints the usage; a bad flag or an argument is refused with it.
func TestFlags(t *testing.T) { extest.CheckFlags(t, "sleep-wake") }

// Without a driver: one line, naming the path tried.
func TestNoDriver(t *testing.T) { extest.CheckNoDriver(t, "sleep-wake") }

// The program runs on the fake driver, checks its data and says OK.
func TestOnFakeDriver(t *testing.T) {
	code, stdout, stderr := extest.Run(t, extest.Fake(t, "1"))
	if code != 0 || !strings.Contains(stdout, "OK: ") {
		t.Fatalf("on the fake driver: status %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	t.Log(strings.TrimSpace(stdout))
}
