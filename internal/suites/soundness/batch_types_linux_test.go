package soundness_test

import (
	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// The batched copies' types, in the sweep (see types).
func init() {
	register("cuda",
		cuda.BatchCopyError{}, cuda.MemcpyAttributes{}, cuda.MemcpyBatchPath(0), cuda.MemcpyFlags(0),
		cuda.MemcpySrcAccessOrder(0),
	)
	register("buffer", buffer.Copy{})
}
