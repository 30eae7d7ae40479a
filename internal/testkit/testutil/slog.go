package testutil

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// Log collects the text records written to it (safe for concurrent use).
type Log struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// Lines returns the records written so far, one a line.
func (l *Log) Lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.TrimSuffix(l.buf.String(), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// CaptureSlog makes slog.Default() write text records at level and above
// to the returned Log until the test ends (then the old default is back).
// The default logger is process-wide: tests that call it must not run in
// parallel with others that log.
func CaptureSlog(t testing.TB, level slog.Level) *Log {
	t.Helper()
	l := &Log{}
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	slog.SetDefault(slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: level})))
	return l
}
