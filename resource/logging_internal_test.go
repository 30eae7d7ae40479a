package resource

import (
	"context"
	"io"
	"log/slog"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// pairUpstream is the cheapest possible upstream: one made-up address,
// no books. It implements ownerAllocator, as the pools do, so that an
// adaptor over it builds one Buffer per allocation, not two: the
// comparison below then measures the adaptor and nothing else.
type pairUpstream struct{}

func (pairUpstream) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Owned(0x10000, size, pairUpstream{}, s), nil
}

func (pairUpstream) allocateFor(owner buffer.MemoryResource, size uint64, s *cuda.Stream) (*buffer.Buffer, cuda.DevicePtr, error) {
	return buffer.Owned(0x10000, size, owner, s), 0x10000, nil
}

func (pairUpstream) Deallocate(cuda.DevicePtr, uint64, *cuda.Stream) error { return nil }
func (pairUpstream) DeviceAccessible() bool                                { return true }
func (pairUpstream) HostAccessible() bool                                  { return false }
func (pairUpstream) DeviceID() int                                         { return 0 }

// offLogger is a logger whose handler takes Info and above: Debug records
// are off, as in a production program.
func offLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func pair(tb testing.TB, mr buffer.MemoryResource) {
	b, err := mr.Allocate(256, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if err := b.Close(); err != nil {
		tb.Fatal(err)
	}
}

// TestLoggingOffAllocs: with Debug off, a pair through Logging allocates
// exactly what the bare upstream's pair does (the Buffer), nothing more.
func TestLoggingOffAllocs(t *testing.T) {
	up := pairUpstream{}
	mr := NewLogging(up, offLogger(), nil)
	bare := testing.AllocsPerRun(1000, func() { pair(t, up) })
	logged := testing.AllocsPerRun(1000, func() { pair(t, mr) })
	t.Logf("allocations per pair: bare %v, through Logging (off) %v", bare, logged)
	if logged != bare {
		t.Errorf("Logging with Debug off allocates %v per pair, the bare upstream %v", logged, bare)
	}
	// With a *slog.LevelVar at Info the records are at Debug: still off.
	var lv slog.LevelVar
	lv.Set(slog.LevelInfo)
	h := slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: &lv})
	mr = NewLogging(up, slog.New(h), nil)
	if n := testing.AllocsPerRun(1000, func() { pair(t, mr) }); n != bare {
		t.Errorf("Logging under a LevelVar at Info allocates %v per pair, the bare upstream %v", n, bare)
	}
	if mr.logger.Enabled(context.Background(), slog.LevelDebug) {
		t.Fatal("Debug is on")
	}
}

// BenchmarkLoggingPair compares an allocate+free pair through the bare
// upstream with one through a Logging over it, its records off (the
// handler takes Info and above) and on (to io.Discard), in one run: the
// "off" case should stay within 5 % of "bare".
func BenchmarkLoggingPair(b *testing.B) {
	up := pairUpstream{}
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			pair(b, up)
		}
	})
	b.Run("off", func(b *testing.B) {
		mr := NewLogging(up, offLogger(), nil)
		b.ReportAllocs()
		for b.Loop() {
			pair(b, mr)
		}
	})
	b.Run("on", func(b *testing.B) {
		mr := NewLogging(up, slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelDebug})), &LoggingOptions{Name: "bench"})
		b.ReportAllocs()
		for b.Loop() {
			pair(b, mr)
		}
	})
}
