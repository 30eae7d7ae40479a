//go:build unix

package virtual

import (
	"errors"
	"strings"
	"testing"

	"github.com/cudamem/cudamem/cuda"
)

// TestSleepRefusesExported: memory exported to another process cannot
// sleep (its importers map the same physical memory), and the refusal
// leaves the buffer usable. fdFake hands out real fds.
func TestSleepRefusesExported(t *testing.T) {
	lf := &lockedFake{f: newFake(testGran)}
	lf.f.next = fakeBase + sleepBase.Add(1)<<40
	r, err := newResource(fdFake{lf}, fakeDevice, &Options{HandleType: HandlePosixFD, Tag: "weights"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Allocate(testGran, nil)
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := r.Export(b)
	if err != nil {
		t.Fatal(err)
	}
	if err := CloseChunkFDs(chunks); err != nil {
		t.Fatal(err)
	}
	if err := r.Sleep(nil, "weights"); !errors.Is(err, cuda.ErrInvalidArgument) || !strings.Contains(err.Error(), "exported") {
		t.Fatalf("Sleep of exported memory = %v, want it refused", err)
	}
	if err := b.Use("test", func(cuda.DevicePtr) error { return nil }); err != nil {
		t.Fatalf("refused Sleep left the buffer unusable: %v", err)
	}
	closeAll(t, r, lf.f, b)
}
