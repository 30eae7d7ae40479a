package buffer_test

import (
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
)

// Benchmarks of batched copies: 10,000 copies of 4 KiB, host to device
// from pinned memory and device to device, each 4 KiB block of the source
// to a scattered block of the destination. One iteration submits the
// 10,000 copies; the stream is synchronized once after the last iteration,
// inside the timed span (after an untimed warm-up batch), as the C
// baseline's batch/* measurements (testdata/cgobench) do. They report
// ns/copy and copies/s, and submit-ns/copy, the host time of the
// submission alone. Variants:
//
//   - batched: CopyBatch, cuMemcpyBatchAsync calls of up to 1,024 copies
//     where the driver has it (see cuda.Device.MemcpyBatchPath;
//     CUDAMEM_BATCH_CHUNK sets the copies per call, 100000 for one call);
//   - loop: CopyBatch forced down its loop, one cuMemcpyAsync per copy;
//   - raw-batched: cuda.Stream.MemcpyBatchAsync on the addresses, without
//     CopyBatch's checks and holds, and without location hints;
//   - raw-hinted: the same with the one attribute CopyBatch passes (the
//     operands' locations as hints);
//   - copyto: one Buffer.CopyTo per copy between views made beforehand,
//     what code without batches writes.
//
// Run: go test ./buffer -run '^$' -bench 'BenchmarkCopyBatch' -benchtime 20x

const (
	batchCopies = 10_000
	batchBlock  = 4 << 10
)

func BenchmarkCopyBatch(b *testing.B) {
	for _, dir := range []string{"htod", "dtod"} {
		for _, mode := range []string{"batched", "loop", "raw-batched", "raw-hinted", "raw-captured", "raw-captured-gap", "raw-captured-chunked", "copyto"} {
			b.Run(dir+"/"+mode, func(b *testing.B) { benchCopyBatch(b, dir, mode) })
		}
	}
}

func benchCopyBatch(b *testing.B, dir, mode string) {
	d := cudatest.Device(b)
	s := cudatest.Stream(b, d)
	const size = batchCopies * batchBlock
	var src *buffer.Buffer
	if dir == "htod" {
		src = benchAlloc(b, &pinnedResource{dev: d}, size, s)
	} else {
		src = benchAlloc(b, &deviceResource{dev: d}, size, s)
	}
	dst := benchAlloc(b, &deviceResource{dev: d}, size, s)
	copies := make([]buffer.Copy, batchCopies)
	dsts := make([]cuda.DevicePtr, batchCopies)
	srcs := make([]cuda.DevicePtr, batchCopies)
	sizes := make([]uint64, batchCopies)
	for i := range copies {
		j := uint64(i) * 7919 % batchCopies // a permutation: 7919 is prime
		copies[i] = buffer.Copy{Dst: dst, Src: src, DstOffset: j * batchBlock, SrcOffset: uint64(i) * batchBlock, Size: batchBlock}
		dsts[i], srcs[i], sizes[i] = dst.Ptr()+cuda.DevicePtr(j*batchBlock), src.Ptr()+cuda.DevicePtr(uint64(i)*batchBlock), batchBlock
	}
	if v := os.Getenv("CUDAMEM_BATCH_CHUNK"); v != "" { // copies per driver call; e.g. 100000: one call
		c, err := strconv.Atoi(v)
		if err != nil {
			b.Fatalf("CUDAMEM_BATCH_CHUNK=%q", v)
		}
		defer buffer.SetBatchChunk(c)()
		b.Logf("copies per driver call: %d", c)
	}
	var op func() error
	switch mode {
	case "batched":
		op = func() error { return buffer.CopyBatch(s, copies) }
	case "loop":
		defer buffer.ForceBatchLoop(true)()
		op = func() error { return buffer.CopyBatch(s, copies) }
	case "raw-batched":
		op = func() error { return s.MemcpyBatchAsync(dsts, srcs, sizes, nil, nil) }
	case "raw-hinted": // the one attribute CopyBatch gives these copies
		src := cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(d.Ordinal())}
		if dir == "htod" {
			src = cuda.MemLocation{Type: cuda.MemLocationTypeHost}
		}
		attrs := []cuda.MemcpyAttributes{{SrcAccessOrder: cuda.MemcpySrcAccessOrderStream, SrcLocHint: src,
			DstLocHint: cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(d.Ordinal())}}}
		op = func() error { return s.MemcpyBatchAsync(dsts, srcs, sizes, attrs, []uint64{0}) }
	case "raw-captured": // the arrays CopyBatch builds, submitted raw
		cd, cs, cz, ca, ci, err := buffer.BatchArrays(s, copies)
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("CopyBatch's arrays equal the raw ones: dsts %v, srcs %v, sizes %v; attrs %+v at %v",
			slices.Equal(cd, dsts), slices.Equal(cs, srcs), slices.Equal(cz, sizes), ca, ci)
		op = func() error { return s.MemcpyBatchAsync(cd, cs, cz, ca, ci) }
	case "raw-captured-gap":
		// The raw call on CopyBatch's arrays, with CopyBatch's own host
		// work (measured with the driver call left out) spent spinning
		// before each call: whether the gap between submissions, rather
		// than anything in the call, is what slows CopyBatch down.
		cd, cs, cz, ca, ci, gap := gapArrays(b, s, copies)
		op = func() error {
			for t0 := time.Now(); time.Since(t0) < gap; {
			}
			return s.MemcpyBatchAsync(cd, cs, cz, ca, ci)
		}
	case "raw-captured-chunked":
		// raw-captured-gap with the batch cut into chunks of
		// CUDAMEM_BENCH_CHUNK copies (default 1000), the same host time
		// spread before the chunks: whether submitting a batch in pieces
		// as it is prepared keeps the copy engine fed.
		cd, cs, cz, ca, ci, gap := gapArrays(b, s, copies)
		chunk := 1000
		if v := os.Getenv("CUDAMEM_BENCH_CHUNK"); v != "" {
			var err error
			if chunk, err = strconv.Atoi(v); err != nil || chunk <= 0 {
				b.Fatalf("CUDAMEM_BENCH_CHUNK=%q", v)
			}
		}
		if len(ci) != 1 {
			b.Fatalf("%d attribute runs, want 1", len(ci))
		}
		per := gap * time.Duration(chunk) / batchCopies
		b.Logf("host work %v per batch, in chunks of %d copies (%v before each)", gap, chunk, per)
		op = func() error {
			for lo := 0; lo < len(cd); lo += chunk {
				hi := min(lo+chunk, len(cd))
				for t0 := time.Now(); time.Since(t0) < per; {
				}
				if err := s.MemcpyBatchAsync(cd[lo:hi], cs[lo:hi], cz[lo:hi], ca, []uint64{0}); err != nil {
					return err
				}
			}
			return nil
		}
	case "copyto":
		dv := make([]*buffer.Buffer, batchCopies)
		sv := make([]*buffer.Buffer, batchCopies)
		for i, c := range copies {
			var err error
			if dv[i], err = dst.Slice(c.DstOffset, c.Size); err != nil {
				b.Fatal(err)
			}
			if sv[i], err = src.Slice(c.SrcOffset, c.Size); err != nil {
				b.Fatal(err)
			}
		}
		op = func() error {
			for i := range dv {
				if err := sv[i].CopyTo(dv[i], s); err != nil {
					return err
				}
			}
			return nil
		}
	}
	b.Logf("%v, batch path %v", d, d.MemcpyBatchPath())
	if err := op(); err != nil {
		b.Fatal(err)
	}
	if err := s.Sync(); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(size)
	b.ReportAllocs()
	var submit time.Duration
	start := time.Now()
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if err := op(); err != nil {
			b.Fatal(err)
		}
		submit += time.Since(t0)
	}
	if err := s.Sync(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	total := float64(time.Since(start).Nanoseconds())
	n := float64(b.N) * batchCopies
	b.ReportMetric(total/n, "ns/copy")
	b.ReportMetric(n/(total/1e9), "copies/s")
	b.ReportMetric(float64(submit.Nanoseconds())/n, "submit-ns/copy")
}

// gapArrays returns the arrays CopyBatch passes the driver for copies, and
// the host time to spend before submitting them: CopyBatch's own work on
// them (measured with the driver call left out), or CUDAMEM_BENCH_GAP
// (e.g. 100us: how the rate depends on the gap).
func gapArrays(b *testing.B, s *cuda.Stream, copies []buffer.Copy) (dsts, srcs []cuda.DevicePtr, sizes []uint64, attrs []cuda.MemcpyAttributes, idxs []uint64, gap time.Duration) {
	b.Helper()
	dsts, srcs, sizes, attrs, idxs, err := buffer.BatchArrays(s, copies)
	if err != nil {
		b.Fatal(err)
	}
	if gap, err = buffer.CopyBatchHostTime(s, copies, 21); err != nil {
		b.Fatal(err)
	}
	b.Logf("CopyBatch's host work per batch: %v", gap)
	if v := os.Getenv("CUDAMEM_BENCH_GAP"); v != "" {
		if gap, err = time.ParseDuration(v); err != nil {
			b.Fatal(err)
		}
		b.Logf("gap set by CUDAMEM_BENCH_GAP: %v", gap)
	}
	return dsts, srcs, sizes, attrs, idxs, gap
}
