//go:build cudamemfault

package faultsweep

import (
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/internal/batchhook"
)

// TestFaultSweepCopyBatch: a batch of copies through the batched call and
// through the loop, each driver call failing in turn.
func TestFaultSweepCopyBatch(t *testing.T) {
	const size, block = 64 << 10, 4 << 10
	batch := func(loop bool) func(p *pair) error {
		return func(p *pair) error {
			batchhook.ForceLoop.Store(loop)
			defer batchhook.ForceLoop.Store(false)
			var copies []buffer.Copy
			for o := uint64(0); o < size; o += block {
				copies = append(copies, buffer.Copy{Dst: p.b, Src: p.a, DstOffset: o, SrcOffset: o, Size: block})
			}
			return buffer.CopyBatch(p.s, copies)
		}
	}
	sweepAll(t, []sweepCase{
		copyCase("CopyBatch", size, 0, 0, batch(false), bIsA),
		copyCase("CopyBatch loop", size, 0, 0, batch(true), bIsA),
	})
}
