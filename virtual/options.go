package virtual

import (
	"fmt"
	"runtime"

	"github.com/cudamem/cudamem/cuda"
)

// AllocationType is the kind of physical memory.
type AllocationType int

// Allocation types.
const (
	Pinned  AllocationType = iota // stays where it is placed (the default)
	Managed                       // may migrate (CUDA 13 drivers)
)

// LocationType is where the physical memory lives.
type LocationType int

// Locations.
const (
	OnDevice          LocationType = iota // the resource's device (the default)
	OnHost                                // host memory
	OnHostNUMA                            // host memory on Options.NUMANode
	OnHostNUMACurrent                     // host memory on the calling thread's NUMA node
)

// HandleType is how allocations can be exported to other processes.
type HandleType int

// Handle types.
const (
	// HandleDefault is HandlePosixFD on Linux and HandleNone elsewhere.
	HandleDefault HandleType = iota
	HandleNone
	HandlePosixFD
	HandleFabric
	HandleWin32 // not supported yet: New reports ErrNotSupported
)

// Granularity picks the allocation unit the driver reports.
type Granularity int

// Granularities.
const (
	Recommended Granularity = iota // the default
	Minimum
)

// Access is the protection a mapping grants.
type Access int

// Access levels.
const (
	ReadWrite Access = iota // the default
	ReadOnly
	NoAccess
)

// Options configure a Resource. The zero value is valid: pinned device
// memory at the recommended granularity, exportable as POSIX fds on Linux,
// read-write for the device, no peers.
type Options struct {
	AllocationType AllocationType
	Location       LocationType
	NUMANode       int // for OnHostNUMA
	HandleType     HandleType
	Granularity    Granularity
	// GPUDirectRDMA asks for memory usable by GPUDirect RDMA (NICs).
	GPUDirectRDMA bool
	// AddrHint asks for allocations at this address (the driver may not
	// honor it). AddrAlign aligns reservations (0: the granularity; else a
	// power of two).
	AddrHint  cuda.DevicePtr
	AddrAlign uint64
	// Reserve is the address space to reserve per allocation, so later
	// grows up to it never move the allocation (0: just the size).
	Reserve uint64
	// Peers are devices granted PeerAccess to every allocation.
	Peers      []*cuda.Device
	SelfAccess Access
	PeerAccess Access
}

func (a Access) flags() (cuda.MemAccessFlags, error) {
	switch a {
	case ReadWrite:
		return cuda.MemAccessProtReadWrite, nil
	case ReadOnly:
		return cuda.MemAccessProtRead, nil
	case NoAccess:
		return cuda.MemAccessProtNone, nil
	}
	return 0, fmt.Errorf("unknown access %d", int(a))
}

func (a Access) String() string {
	switch a {
	case ReadWrite:
		return "read-write"
	case ReadOnly:
		return "read-only"
	case NoAccess:
		return "none"
	}
	return fmt.Sprintf("Access(%d)", int(a))
}

func optErr(option string, format string, args ...any) error {
	return cuda.Errorf("virtual.New", cuda.ErrInvalidArgument, "option "+option+": "+format, args...)
}

// props validates o and builds the driver's allocation properties.
func (o *Options) props(dev *cuda.Device) (cuda.MemAllocationProp, error) {
	var p cuda.MemAllocationProp
	switch o.AllocationType {
	case Pinned:
		p.Type = cuda.MemAllocationTypePinned
	case Managed:
		p.Type = cuda.MemAllocationTypeManaged
	default:
		return p, optErr("AllocationType", "unknown value %d", int(o.AllocationType))
	}
	switch o.Location {
	case OnDevice:
		p.Location = cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(dev.Ordinal())}
	case OnHost:
		p.Location = cuda.MemLocation{Type: cuda.MemLocationTypeHost}
	case OnHostNUMA:
		if o.NUMANode < 0 {
			return p, optErr("NUMANode", "negative node %d", o.NUMANode)
		}
		p.Location = cuda.MemLocation{Type: cuda.MemLocationTypeHostNUMA, ID: int32(o.NUMANode)}
	case OnHostNUMACurrent:
		p.Location = cuda.MemLocation{Type: cuda.MemLocationTypeHostNUMACurrent}
	default:
		return p, optErr("Location", "unknown value %d", int(o.Location))
	}
	switch o.HandleType {
	case HandleDefault:
		if runtime.GOOS == "linux" {
			p.RequestedHandleTypes = cuda.MemHandleTypePosixFileDescriptor
		}
	case HandleNone:
	case HandlePosixFD:
		if runtime.GOOS != "linux" {
			return p, cuda.Errorf("virtual.New", cuda.ErrNotSupported, "option HandleType: POSIX file descriptors need Linux, not %s", runtime.GOOS)
		}
		p.RequestedHandleTypes = cuda.MemHandleTypePosixFileDescriptor
	case HandleFabric:
		p.RequestedHandleTypes = cuda.MemHandleTypeFabric
	case HandleWin32:
		return p, cuda.Errorf("virtual.New", cuda.ErrNotSupported, "option HandleType: Win32 handles are not supported yet")
	default:
		return p, optErr("HandleType", "unknown value %d", int(o.HandleType))
	}
	if o.Granularity != Recommended && o.Granularity != Minimum {
		return p, optErr("Granularity", "unknown value %d", int(o.Granularity))
	}
	if o.GPUDirectRDMA {
		p.AllocFlags.GPUDirectRDMACapable = 1
	}
	if o.AddrAlign&(o.AddrAlign-1) != 0 {
		return p, optErr("AddrAlign", "%d is not a power of two", o.AddrAlign)
	}
	if _, err := o.SelfAccess.flags(); err != nil {
		return p, optErr("SelfAccess", "%v", err)
	}
	if _, err := o.PeerAccess.flags(); err != nil {
		return p, optErr("PeerAccess", "%v", err)
	}
	for i, peer := range o.Peers {
		if peer == nil {
			return p, optErr("Peers", "peer %d is nil", i)
		}
		if peer == dev {
			return p, optErr("Peers", "%v is the resource's own device", peer)
		}
	}
	return p, nil
}
