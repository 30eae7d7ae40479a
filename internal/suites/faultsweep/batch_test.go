//go:build cudamemfault

package faultsweep

import (
	"testing"
	_ "unsafe" // for go:linkname

	"github.com/cudamem/cudamem/buffer"
)

// forceBatchLoop is package cuda's test switch that sends every batch down
// the loop of cuMemcpyAsync (cuda/batch.go); restore puts the previous
// setting back.
//
//go:linkname forceBatchLoop github.com/cudamem/cudamem/cuda.forceBatchLoop
func forceBatchLoop(on bool) (restore func())

// TestFaultSweepCopyBatch: a batch of copies through the batched call and
// through the loop, each driver call failing in turn.
func TestFaultSweepCopyBatch(t *testing.T) {
	const size, block = 64 << 10, 4 << 10
	batch := func(loop bool) func(p *pair) error {
		return func(p *pair) error {
			defer forceBatchLoop(loop)()
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
