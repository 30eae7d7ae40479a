//go:build !linux

package virtual

import "unsafe"

// hostAlloc pins size bytes of host memory for a backup.
func (d device) hostAlloc(size uint64) ([]byte, error) {
	p, err := d.MemHostAlloc(size, 0)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), size), nil
}

func (d device) hostFree(mem []byte) error {
	return d.MemFreeHost(unsafe.Pointer(unsafe.SliceData(mem)))
}
