package resource

import (
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/ownedmem"
)

// The pools' Buffers skip the record of addresses handed out (ptrSet):
// buffer.Allocate comes here for a DevicePool or PinnedPool, and the
// Buffer's Close frees here (see package ownedmem).
func init() {
	ownedmem.Register(ownedmem.Funcs{
		Allocate: func(mr any, size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, bool, error) {
			switch p := mr.(type) {
			case *DevicePool:
				if p != nil {
					ptr, rs, err := p.core.allocatePtr("DevicePool", size, s, false)
					return ptr, rs, true, err
				}
			case *PinnedPool:
				if p != nil {
					ptr, rs, err := p.core.allocatePtr("PinnedPool", size, s, false)
					return ptr, rs, true, err
				}
			}
			return 0, nil, false, nil // the public methods report nil receivers
		},
		Free: func(mr any, ptr cuda.DevicePtr, size uint64, s *cuda.Stream) (bool, error) {
			if ptr == 0 {
				return false, nil
			}
			switch p := mr.(type) {
			case *DevicePool:
				if p != nil {
					return true, p.core.deallocate("DevicePool", ptr, size, s, false)
				}
			case *PinnedPool:
				if p != nil {
					return true, p.core.deallocate("PinnedPool", ptr, size, s, false)
				}
			}
			return false, nil
		},
		Adopt: func(mr any, ptr cuda.DevicePtr, size uint64) {
			switch p := mr.(type) {
			case *DevicePool:
				if p != nil {
					p.core.ptrs.add(ptr, size)
				}
			case *PinnedPool:
				if p != nil {
					p.core.ptrs.add(ptr, size)
				}
			}
		},
	})
}
