package resource

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// pairUpstream is the cheapest possible upstream: one made-up address,
// no books. An adaptor over it builds one Buffer per allocation: the
// comparison below then measures the adaptor and nothing else. It is a
// pointer, as real resources are, so that its Buffers hold a heap
// pointer to their resource as the adaptor's do (a zero-size value type
// would spare the bare pair the collector's write barriers, about 5 %).
type pairUpstream struct{ _ int }

func (u *pairUpstream) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(u, size, s)
}

func (*pairUpstream) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	return 0x10000, s, nil
}

func (*pairUpstream) Deallocate(cuda.DevicePtr, uint64, *cuda.Stream) error { return nil }
func (*pairUpstream) DeviceAccessible() bool                                { return true }
func (*pairUpstream) HostAccessible() bool                                  { return false }
func (*pairUpstream) DeviceID() int                                         { return 0 }

// offLogger is a logger whose handler takes Info and above: Debug records
// are off, as in a production program.
func offLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func pair(tb testing.TB, mr buffer.MemoryResource) {
	b, err := buffer.Allocate(mr, 256, nil)
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
	up := &pairUpstream{}
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
	if mr.logger.Enabled(context.Background(), mr.level()) {
		t.Fatal("Debug is on")
	}
}

// BenchmarkLoggingPair compares an allocate+free pair through the bare
// upstream with one through a Logging over it, its records off (the
// handler takes Info and above) and on (to io.Discard), in one run: the
// "off" case should stay within 5 % of "bare".
func BenchmarkLoggingPair(b *testing.B) {
	up := &pairUpstream{}
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

// BenchmarkLoggingOffRatio alternates short rounds of bare pairs and of
// pairs through a Logging with its records off, so that both see the same
// machine load (on a shared machine, separate benchmarks drift by more
// than the 5 % budget), and reports the median ratio of the rounds. The
// order alternates too, so that a collection set off by one half's
// garbage does not always land in the other. "control" compares the bare
// pair with itself: its ratio is the noise floor.
func BenchmarkLoggingOffRatio(b *testing.B) {
	up := &pairUpstream{}
	b.Run("off", func(b *testing.B) { ratioBench(b, up, NewLogging(up, offLogger(), nil)) })
	b.Run("control", func(b *testing.B) { ratioBench(b, up, up) })
}

func ratioBench(b *testing.B, base, mr buffer.MemoryResource) {
	const round = 512
	var ratios []float64
	var baseNs, mrNs time.Duration
	timed := func(r buffer.MemoryResource) time.Duration {
		t0 := time.Now()
		for range round {
			pair(b, r)
		}
		return time.Since(t0)
	}
	i := 0
	for b.Loop() {
		var tb, tm time.Duration
		if i%2 == 0 {
			tb = timed(base)
			tm = timed(mr)
		} else {
			tm = timed(mr)
			tb = timed(base)
		}
		i++
		baseNs += tb
		mrNs += tm
		ratios = append(ratios, float64(tm)/float64(tb))
	}
	slices.Sort(ratios)
	n := float64(b.N * round)
	b.ReportMetric(float64(baseNs)/n, "bare-ns/pair")
	b.ReportMetric(float64(mrNs)/n, "adaptor-ns/pair")
	b.ReportMetric(ratios[len(ratios)/2], "median-ratio")
	b.ReportMetric(0, "ns/op")
}
