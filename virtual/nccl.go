package virtual

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// NCCLOptions returns the options NCCL's ncclMemAlloc allocates user
// buffers with, so allocations of a Resource made from them can be
// registered with NCCL (ncclCommRegister, ncclCommWindowRegister) and used
// by its zero-copy and NVLS paths as memory of its own would be:
//
//   - pinned device memory on dev, at the recommended granularity;
//   - handle types POSIX fd (Linux), plus fabric handles when the device
//     reports fabric support and fabric memory can actually be created and
//     exported (IMEX works: NCCL tries cuMemCreate with fabric and drops
//     it on CUDA_ERROR_NOT_PERMITTED or CUDA_ERROR_NOT_SUPPORTED; this
//     probes once, with one granule, instead of at every allocation);
//   - GPUDirect RDMA capable (allocFlags.gpuDirectRDMACapable) when the
//     device supports GPUDirect RDMA with VMM
//     (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED);
//   - read-write access for dev and for each of peers (NCCL grants every
//     device that can access dev; pass those you need, each of which must
//     be able to: New checks).
//
// Errors other than the driver's refusal of fabric handles (no driver, no
// VMM support: cuda.ErrNotSupported) are returned. Pass the result to New.
func NCCLOptions(dev *cuda.Device, peers ...*cuda.Device) (*Options, error) {
	if dev == nil {
		return nil, cuda.Errorf("virtual.NCCLOptions", cuda.ErrInvalidArgument, "nil device")
	}
	return ncclOptions(device{dev}, dev, runtime.GOOS, peers)
}

// ncclOptions is NCCLOptions over any driver, for a target OS.
func ncclOptions(drv driver, dev *cuda.Device, goos string, peers []*cuda.Device) (*Options, error) {
	const op = "virtual.NCCLOptions"
	if err := checkPeers(op, "peer", dev, peers); err != nil {
		return nil, err
	}
	f, err := drv.Features()
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: err}
	}
	if !f.VirtualMemory {
		return nil, cuda.Errorf(op, cuda.ErrNotSupported, "%v has no virtual memory management (NCCL falls back to cudaMalloc there)", dev)
	}
	o := &Options{
		AllocationType: Pinned,
		Location:       OnDevice,
		Granularity:    Recommended,
		GPUDirectRDMA:  f.GPUDirectRDMAWithVMM,
		SelfAccess:     ReadWrite,
		PeerAccess:     ReadWrite,
		Peers:          append([]*cuda.Device(nil), peers...),
		HandleType:     HandleNone,
	}
	posix := goos == "linux" && f.PosixFDHandles
	if posix {
		o.HandleType = HandlePosixFD
	}
	// cuda's fabric probe, run through the driver seam.
	prop := cuda.MemAllocationProp{Location: devLoc(dev)}
	if o.GPUDirectRDMA {
		prop.AllocFlags.GPUDirectRDMACapable = 1
	}
	ferr := cuda.CheckFabricWith(drv, prop)
	switch {
	case ferr == nil && posix:
		o.HandleType = HandlePosixFDAndFabric
	case ferr == nil:
		o.HandleType = HandleFabric
	case !errors.Is(ferr, cuda.ErrNotSupported):
		return nil, &cuda.OpError{Op: op, Err: ferr}
	}
	return o, nil
}

// AllocationProperties reads back the properties b's first physical
// chunk was created with, as the driver reports them
// (cuMemGetAllocationPropertiesFromHandle): handle types, location,
// allocation flags; for example, to check that NCCLOptions gave NCCL's.
func (r *Resource) AllocationProperties(b *buffer.Buffer) (cuda.MemAllocationProp, error) {
	const op = "Resource.AllocationProperties"
	var prop cuda.MemAllocationProp
	err := r.withLive(op, b, func(a *allocation) error {
		// The allocation's own handle: retaining another by address
		// (cuMemRetainAllocationHandle) would need a release that can fail
		// and leave the memory allocated after Close.
		var err error
		if prop, err = r.drv.MemAllocationProperties(a.chunks[0].h); err != nil {
			return &cuda.OpError{Op: op, Err: fmt.Errorf("%#x: %w", uint64(a.base), err)}
		}
		return nil
	})
	if err != nil {
		return cuda.MemAllocationProp{}, err
	}
	return prop, nil
}
