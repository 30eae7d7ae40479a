package cuda_test

import (
	"reflect"

	"github.com/cudamem/cudamem/cuda"
)

// The batched copies' types, in the nil/zero sweep (see exportedTypes).
func init() {
	for _, v := range []any{
		cuda.BatchCopyError{}, cuda.MemcpyAttributes{}, cuda.MemcpyBatchPath(0), cuda.MemcpyFlags(0),
		cuda.MemcpySrcAccessOrder(0),
	} {
		t := reflect.TypeOf(v)
		exportedTypes[t.Name()] = t
	}
}
