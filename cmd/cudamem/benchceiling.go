package main

import (
	"cmp"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
	"unsafe"
)

// The ceilings: what the host alone can do, with no device in the
// timing, for the copies out of a device into Go memory to be read
// against. A staged copy out is the DMA into pinned chunks and the
// workers' memmove from there into the destination, plus, for a fresh
// destination, the kernel mapping every page on first write. Mapping
// fresh pages, and a memmove into them, bound a copy into fresh memory.
// The memmove into mapped memory reads its source from memory, where a
// staged copy reads chunks the DMA has just written, often in cache: it
// shows what the memory moves, not a bound.
//
//   - ceiling/map/SIZE/wN: N goroutines have the kernel map SIZE bytes
//     of fresh pages (released before every repetition, untimed), each
//     its share, with no bytes copied (madvise MADV_POPULATE_WRITE, or a
//     write per page where the kernel refuses it);
//   - ceiling/map_huge/SIZE/wN: the same where the pages may be huge
//     (madvise MADV_HUGEPAGE first, as the staging parameter huge does);
//   - ceiling/memmove/SIZE/wN: N goroutines copy SIZE bytes of pinned
//     host memory into mapped Go memory, each its share;
//   - ceiling/memmove_fresh/SIZE/wN: the same into fresh pages.
const ceilingPrefix = "ceiling/"

// ceilingSizes are the sizes of the ceilings: the staging sweep's.
func ceilingSizes(max uint64) []uint64 { return sweepSizes(max) }

// ceilingWorkers are the goroutine counts: one, the staging default's
// and GOMAXPROCS.
func ceilingWorkers(def int) []int {
	w := []int{1, def, runtime.GOMAXPROCS(0)}
	slices.Sort(w)
	return slices.Compact(w)
}

func ceilingMeasurements(e *benchEnv) []measurement {
	h := e.host
	var ms []measurement
	for _, n := range ceilingSizes(h.max) {
		for _, kind := range []string{"map", "map_huge", "memmove", "memmove_fresh"} {
			for _, w := range ceilingWorkers(e.staging.OutWorkers) {
				ms = append(ms, measurement{
					name:  fmt.Sprintf("%s%s/%s/w%d", ceilingPrefix, kind, sizeLabel(n), w),
					iters: hostIters(n), bytes: n, setup: h.setup,
					run: func(iters int) (time.Duration, error) {
						src := unsafe.Slice((*byte)(h.pinned), n)
						dst := h.page[:n]
						var each func(d, s []byte) error
						switch kind {
						case "map":
							dst = h.fresh[:n]
							each = func(d, _ []byte) error { return populatePages(d) }
						case "map_huge":
							dst = h.freshHuge[:n]
							adviseHuge(dst)
							each = func(d, _ []byte) error { return populatePages(d) }
						case "memmove":
							each = func(d, s []byte) error { copy(d, s); return nil }
						default:
							dst = h.fresh[:n]
							each = func(d, s []byte) error { copy(d, s); return nil }
						}
						var fresh []byte
						if kind != "memmove" {
							fresh = dst
						}
						return h.loop(iters, fresh, func() error { return inParallel(w, dst, src, each) })
					},
				})
			}
		}
	}
	return ms
}

// inParallel runs f on w goroutines, each on its own page-aligned share
// of dst and the same share of src, and returns the first error.
func inParallel(w int, dst, src []byte, f func(d, s []byte) error) error {
	const page = 4096
	share := ((len(dst)+w-1)/w + page - 1) &^ (page - 1)
	errs := make([]error, w)
	var wg sync.WaitGroup
	for i := range w {
		lo := min(i*share, len(dst))
		hi := min(lo+share, len(dst))
		if lo == hi {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f(dst[lo:hi], src[lo:hi])
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// ceilingKey parses "ceiling/map/1GiB/w16" into its parts.
func ceilingKey(name string) (kind, size string, workers int, ok bool) {
	rest, ok := strings.CutPrefix(name, ceilingPrefix)
	if !ok {
		return "", "", 0, false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 3 || !strings.HasPrefix(parts[2], "w") {
		return "", "", 0, false
	}
	w, err := strconv.Atoi(parts[2][1:])
	if err != nil {
		return "", "", 0, false
	}
	return parts[0], parts[1], w, true
}

// printCeilings prints the ceilings by size and goroutines (GB/s,
// medians), beside the staged copy out of the device of the same size
// (hostcopy's, with the staging defaults' workers), reused and fresh.
func printCeilings(w io.Writer, ours []result) {
	type key struct {
		size string
		w    int
	}
	var keys []key
	gb := map[string]float64{}
	for _, s := range summarize(ours) {
		if s.N == 0 || s.GBps <= 0 {
			continue
		}
		gb[s.Name] = s.GBps
		if kind, size, n, ok := ceilingKey(s.Name); ok && kind == "map" {
			keys = append(keys, key{size, n})
		}
	}
	if len(keys) == 0 {
		return
	}
	slices.SortFunc(keys, func(a, b key) int {
		return cmp.Or(cmp.Compare(mustSize(a.size), mustSize(b.size)), cmp.Compare(a.w, b.w))
	})
	cell := func(name string) string {
		if v, ok := gb[name]; ok {
			return fmt.Sprintf("%.1f", v)
		}
		return "-"
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "ceilings, the host alone (GB/s, medians; the staged copy out of the device beside them):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "size\tgoroutines\tmap fresh pages\thuge pages\tmemmove\tmemmove into fresh pages\tstaged copy out\tstaged, into fresh")
	for _, k := range keys {
		c := func(kind string) string { return cell(fmt.Sprintf("%s%s/%s/w%d", ceilingPrefix, kind, k.size, k.w)) }
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", k.size, k.w, c("map"), c("map_huge"), c("memmove"), c("memmove_fresh"),
			cell(hostCopyPrefix+"dtoh/staged/"+k.size), cell(hostCopyPrefix+"dtoh/staged_fresh/"+k.size))
	}
	tw.Flush()
}
