package virtual

import (
	"fmt"
	"math"
	"runtime"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/resource/timeline"
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
	// HandleFabric exports allocations as fabric handles (ExportFabric),
	// importable on other nodes of a multi-node NVLink domain; it needs the
	// IMEX service (see cuda.FabricRequirements).
	HandleFabric
	HandleWin32 // not supported yet: New reports ErrNotSupported
	// HandlePosixFDAndFabric requests both POSIX fds and fabric handles, as
	// NCCL's ncclMemAlloc does where fabric handles work (see NCCLOptions).
	// Linux only.
	HandlePosixFDAndFabric
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
	NUMANode       int // for OnHostNUMA (0 to MaxInt32); must be 0 otherwise
	HandleType     HandleType
	Granularity    Granularity
	// GPUDirectRDMA asks for memory usable by GPUDirect RDMA (NICs).
	GPUDirectRDMA bool
	// AddrHint asks for allocations at this address (the driver may not
	// honor it); it must be a multiple of the alignment. AddrAlign aligns
	// reservations (0: the granularity; else a power of two, used when
	// above the granularity): the driver is asked for that alignment.
	AddrHint  cuda.DevicePtr
	AddrAlign uint64
	// Reserve is the address space to reserve per allocation, so later
	// grows up to it never move the allocation (0: just the size).
	Reserve uint64
	// Peers are devices granted PeerAccess to every allocation (each
	// once, and not the resource's own device).
	Peers      []*cuda.Device
	SelfAccess Access
	PeerAccess Access
	// Tag is the tag of the resource's allocations, which Sleep and Wake
	// select by ("" is a tag like any other); AllocateTagged gives one
	// allocation another.
	Tag string
	// Segments sees each allocation that Sleep unmaps (Released, before
	// the memory goes) and Wake maps again (Acquired, once the contents
	// are back), so that registrations with NCCL or another library can
	// be dropped and made again. A hook's error or panic fails the Sleep
	// or Wake, which then leaves everything as it was.
	Segments *resource.SegmentHooks
	// Timeline, if set, records a timeline.Sleep or timeline.Wake event
	// per allocation that Sleep or Wake changed, with its tag and the
	// call's time (Resource "virtual").
	Timeline *timeline.Log
}

// accessFlags and accessNames are each Access's driver protection and
// name.
var (
	accessFlags = [...]cuda.MemAccessFlags{ReadWrite: cuda.MemAccessProtReadWrite, ReadOnly: cuda.MemAccessProtRead, NoAccess: cuda.MemAccessProtNone}
	accessNames = [...]string{ReadWrite: "read-write", ReadOnly: "read-only", NoAccess: "none"}
)

func (a Access) flags() (cuda.MemAccessFlags, error) {
	if a < 0 || int(a) >= len(accessFlags) {
		return 0, fmt.Errorf("unknown access %d", int(a))
	}
	return accessFlags[a], nil
}

func (a Access) String() string {
	if a < 0 || int(a) >= len(accessNames) {
		return fmt.Sprintf("Access(%d)", int(a))
	}
	return accessNames[a]
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
		if dev == nil {
			return p, cuda.Errorf("virtual.New", cuda.ErrInvalidArgument, "nil device")
		}
		p.Location = cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(ordinal(dev))}
	case OnHost:
		p.Location = cuda.MemLocation{Type: cuda.MemLocationTypeHost}
	case OnHostNUMA:
		// The driver takes the node as a 32-bit int: larger values would
		// silently become another node.
		if o.NUMANode < 0 || o.NUMANode > math.MaxInt32 {
			return p, optErr("NUMANode", "node %d is out of range [0, %d]", o.NUMANode, math.MaxInt32)
		}
		p.Location = cuda.MemLocation{Type: cuda.MemLocationTypeHostNUMA, ID: int32(o.NUMANode)}
	case OnHostNUMACurrent:
		p.Location = cuda.MemLocation{Type: cuda.MemLocationTypeHostNUMACurrent}
	default:
		return p, optErr("Location", "unknown value %d", int(o.Location))
	}
	if o.NUMANode != 0 && o.Location != OnHostNUMA {
		// Ignoring it would place the memory somewhere the caller did not ask.
		return p, optErr("NUMANode", "node %d is set but Location is %d, not OnHostNUMA", o.NUMANode, int(o.Location))
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
	case HandlePosixFDAndFabric:
		if runtime.GOOS != "linux" {
			return p, cuda.Errorf("virtual.New", cuda.ErrNotSupported, "option HandleType: POSIX file descriptors need Linux, not %s", runtime.GOOS)
		}
		p.RequestedHandleTypes = cuda.MemHandleTypePosixFileDescriptor | cuda.MemHandleTypeFabric
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
	if err := checkPeers("virtual.New", "option Peers: peer", dev, o.Peers); err != nil {
		return p, err
	}
	return p, nil
}

// checkPeers rejects nil peers, the resource's own device and duplicates
// (the driver would get two access entries for one device). what prefixes
// the message ("option Peers: peer", "peer").
func checkPeers(op, what string, dev *cuda.Device, peers []*cuda.Device) error {
	for i, peer := range peers {
		if peer == nil {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "%s %d is nil", what, i)
		}
		if dev != nil && (peer == dev || ordinal(peer) == ordinal(dev)) {
			return cuda.Errorf(op, cuda.ErrInvalidArgument, "%s %d (%v) is the resource's own device", what, i, peer)
		}
		for j, q := range peers[:i] {
			if q == peer || ordinal(q) == ordinal(peer) {
				return cuda.Errorf(op, cuda.ErrInvalidArgument, "%s %d (%v) is also peer %d", what, i, peer, j)
			}
		}
	}
	return nil
}

// layout validates the options that depend on the granularity and returns
// the reservation alignment and the per-allocation reserve (Reserve
// rounded up to the granularity).
func (o *Options) layout(gran uint64) (align, reserve uint64, err error) {
	align = max(gran, o.AddrAlign)
	reserve, ok := roundUp(o.Reserve, gran)
	if !ok {
		return 0, 0, optErr("Reserve", "%d bytes rounded up to the granularity %d overflows", o.Reserve, gran)
	}
	if o.AddrHint%cuda.DevicePtr(align) != 0 {
		return 0, 0, optErr("AddrHint", "%#x is not a multiple of the alignment %d", uint64(o.AddrHint), align)
	}
	if end := uint64(o.AddrHint) + max(reserve, gran); o.AddrHint != 0 && end < uint64(o.AddrHint) {
		return 0, 0, optErr("AddrHint", "%#x plus a reservation of %d bytes overflows", uint64(o.AddrHint), max(reserve, gran))
	}
	return align, reserve, nil
}
