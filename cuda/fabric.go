package cuda

import (
	"errors"
	"fmt"
	"hash/fnv"
	"unsafe"
)

// This file holds fabric handles (CU_MEM_HANDLE_TYPE_FABRIC): 64 plain
// bytes that share VMM allocations and pools across the nodes of a
// multi-node NVLink domain, over any channel. Without IMEX the driver
// refuses them, which this package reports as ErrNotSupported naming IMEX
// (FabricError).

// FabricRequirements says, in words, what fabric handles need. Errors for a
// system without them include it.
const FabricRequirements = "fabric handles need the IMEX service (nvidia-imex) running with an IMEX channel " +
	"this process can open (/dev/nvidia-caps-imex-channels), on a multi-node NVLink domain such as GB200 NVL72"

// FabricError reports err, a driver error from a fabric-handle operation op,
// as not supported when the driver refused fabric handles
// (CUDA_ERROR_NOT_PERMITTED or CUDA_ERROR_NOT_SUPPORTED): the result
// matches ErrNotSupported and still the driver's Result, and says what
// fabric handles need. Other errors, and nil, are returned unchanged.
func FabricError(op string, err error) error {
	if err == nil || !(errors.Is(err, ErrorNotPermitted) || errors.Is(err, ErrorNotSupported)) {
		return err
	}
	if errors.Is(err, errFabric) {
		return err // already explained
	}
	return &OpError{Op: op, Err: &fabricError{err: err}}
}

// errFabric marks errors FabricError made, so they are explained once.
var errFabric = errors.New("fabric handles unavailable")

type fabricError struct{ err error }

func (e *fabricError) Error() string {
	return fmt.Sprintf("%v: %s (driver: %v)", ErrNotSupported, FabricRequirements, e.err)
}

func (e *fabricError) Unwrap() []error { return []error{ErrNotSupported, errFabric, e.err} }

// MarshalBinary returns the handle's 64 bytes, as the driver made them: the
// form to send to the importing process (there is nothing to add: the
// driver's import checks the handle, and refuses one it does not know).
func (h MemFabricHandle) MarshalBinary() ([]byte, error) {
	return append([]byte(nil), h.Data[:]...), nil
}

// UnmarshalBinary sets h from exactly IPCHandleSize bytes. Any other length,
// and the all-zero handle (which no export produces), is refused with an
// error matching ErrInvalidArgument, and h is left unchanged.
func (h *MemFabricHandle) UnmarshalBinary(b []byte) error {
	const op = "MemFabricHandle.UnmarshalBinary"
	switch {
	case h == nil:
		return Errorf(op, ErrInvalidArgument, "nil *MemFabricHandle")
	case len(b) != IPCHandleSize:
		return Errorf(op, ErrInvalidArgument, "%d bytes, want %d (a CUmemFabricHandle)", len(b), IPCHandleSize)
	}
	var n MemFabricHandle
	copy(n.Data[:], b)
	if n.IsZero() {
		return Errorf(op, ErrInvalidArgument, "all %d bytes are zero: not an exported fabric handle", IPCHandleSize)
	}
	*h = n
	return nil
}

// IsZero reports whether every byte of the handle is zero (no export makes
// such a handle).
func (h MemFabricHandle) IsZero() bool { return h == MemFabricHandle{} }

// String names the handle by a short fingerprint (FNV-1a of its bytes), not
// its contents: whoever holds the bytes can map the memory on any node of
// the domain, so logs should not carry them.
func (h MemFabricHandle) String() string {
	if h.IsZero() {
		return "MemFabricHandle(zero)"
	}
	f := fnv.New32a()
	_, _ = f.Write(h.Data[:])
	return fmt.Sprintf("MemFabricHandle(#%08x)", f.Sum32())
}

// FabricHandlesSupported reports whether the device can share memory as
// fabric handles (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED). A true
// answer says the hardware and driver can; whether IMEX lets this process
// use them shows only when memory is created or exported (see CheckFabric).
// The attribute is read afresh each call.
func (d *Device) FabricHandlesSupported() (bool, error) {
	v, err := d.Attribute(DeviceAttrHandleTypeFabricSupported)
	if err != nil {
		return false, err
	}
	return v != 0, nil
}

// CheckFabric reports whether fabric handles work on this device now: nil
// when the device supports them and one granule of fabric-shareable memory
// on it could be created and exported (then released), else an error
// matching ErrNotSupported that names IMEX, with the driver's Result in
// the chain. Other failures are returned as they are. CheckFabricAt
// probes another location.
func (d *Device) CheckFabric() error {
	const op = "Device.CheckFabric"
	if err := d.check(op); err != nil {
		return err
	}
	if d.Ordinal() > 1<<31-1 {
		return Errorf(op, ErrInvalidArgument, "device ordinal %d does not fit a memory location", d.Ordinal())
	}
	return checkFabric(op, d, MemAllocationProp{Location: MemLocation{Type: MemLocationTypeDevice, ID: int32(d.Ordinal())}})
}

// CheckFabricAt is CheckFabric for memory at loc: the probe granule is
// created there, since support depends on where the memory lives.
// CreateMemPool runs it before it makes a pool with fabric handles. Where
// the driver takes no fabric-shareable memory at all (host and
// host-NUMA-current answer CUDA_ERROR_INVALID_VALUE), the error also
// matches ErrNotSupported, with that Result in the chain.
func (d *Device) CheckFabricAt(loc MemLocation) error {
	const op = "Device.CheckFabricAt"
	if err := d.check(op); err != nil {
		return err
	}
	return checkFabric(op, d, MemAllocationProp{Location: loc})
}

// FabricCalls are the driver calls the fabric probe makes; *Device has
// them all. CheckFabricWith takes them as an interface so that a package
// reaching the driver through a seam of its own (package virtual) runs
// this one probe rather than a copy.
type FabricCalls interface {
	FabricHandlesSupported() (bool, error)
	AllocationGranularity(prop *MemAllocationProp, kind MemAllocationGranularity) (uint64, error)
	MemCreate(size uint64, prop *MemAllocationProp) (MemHandle, error)
	MemExportFabric(h MemHandle) (MemFabricHandle, error)
	MemRelease(h MemHandle) error
}

// CheckFabricWith runs the probe of CheckFabricAt through c, for a
// granule with prop's location and allocation flags (GPUDirect RDMA, for
// one); prop's type and handle types are set here (pinned, fabric). A nil
// c is an error matching ErrInvalidArgument.
func CheckFabricWith(c FabricCalls, prop MemAllocationProp) error {
	const op = "CheckFabricWith"
	if c == nil {
		return Errorf(op, ErrInvalidArgument, "nil FabricCalls")
	}
	return checkFabric(op, c, prop)
}

// checkFabric is the fabric probe: the device's answer, then a granule of
// fabric-shareable memory at prop.Location created, exported and
// released.
func checkFabric(op string, c FabricCalls, prop MemAllocationProp) error {
	ok, err := c.FabricHandlesSupported()
	if err != nil {
		return &OpError{Op: op, Err: err}
	}
	if !ok {
		// Reported as a Result, so callers match it as a refused call.
		return &OpError{Op: op, Err: &fabricError{err: fmt.Errorf("%s reports no fabric handle support (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED is 0): %w",
			callsName(c), ErrorNotSupported)}}
	}
	prop.Type = MemAllocationTypePinned
	prop.RequestedHandleTypes = MemHandleTypeFabric
	loc := prop.Location
	g, err := c.AllocationGranularity(&prop, MemAllocationGranularityMinimum)
	if err != nil {
		return &OpError{Op: op, Err: fabricRefused("cuMemGetAllocationGranularity", loc, err)}
	}
	h, err := c.MemCreate(g, &prop)
	if err != nil {
		return &OpError{Op: op, Err: fabricRefused("cuMemCreate", loc, err)}
	}
	_, xerr := c.MemExportFabric(h)
	// Released again once if the first release fails: nothing else holds
	// the probe granule, so giving up would leak it for good.
	if rerr := c.MemRelease(h); rerr != nil {
		if rerr2 := c.MemRelease(h); rerr2 != nil {
			return &OpError{Op: op, Err: errors.Join(xerr, fmt.Errorf("releasing the probe allocation at %s: %w", locationName(loc), rerr), rerr2)}
		}
	}
	if xerr != nil {
		return &OpError{Op: op, Err: fabricRefused("cuMemExportToShareableHandle", loc, xerr)}
	}
	return nil
}

// fabricRefused explains err, a failed probe step named op at loc: a
// refusal of fabric handles (FabricError), including the invalid-value
// answer for location types that take no shareable memory at all. Other
// errors only gain the location.
func fabricRefused(op string, loc MemLocation, err error) error {
	if errors.Is(err, ErrorInvalidValue) && (loc.Type == MemLocationTypeHost || loc.Type == MemLocationTypeHostNUMACurrent) && !errors.Is(err, errFabric) {
		// Its message names the location once.
		return &OpError{Op: op, Err: &fabricLocationError{loc: loc, err: err}}
	}
	return FabricError(op, fmt.Errorf("a fabric-shareable granule at %s: %w", locationName(loc), err))
}

// fabricLocationError is a location type the driver takes no fabric
// memory at: no service would change that, so the message does not send
// the reader to IMEX.
type fabricLocationError struct {
	loc MemLocation
	err error
}

func (e *fabricLocationError) Error() string {
	return fmt.Sprintf("%v: the driver takes no fabric-shareable memory at %s: allocate it on a device or a host NUMA node instead (driver: %v)",
		ErrNotSupported, locationName(e.loc), e.err)
}

func (e *fabricLocationError) Unwrap() []error { return []error{ErrNotSupported, errFabric, e.err} }

// callsName names the device behind c for messages.
func callsName(c FabricCalls) string {
	if s, ok := c.(fmt.Stringer); ok {
		return s.String()
	}
	return "the device"
}

// locationName describes loc in words for messages.
func locationName(loc MemLocation) string {
	switch loc.Type {
	case MemLocationTypeDevice:
		return fmt.Sprintf("device %d", loc.ID)
	case MemLocationTypeHost:
		return "the host"
	case MemLocationTypeHostNUMA:
		return fmt.Sprintf("host NUMA node %d", loc.ID)
	case MemLocationTypeHostNUMACurrent:
		return "the calling thread's host NUMA node"
	}
	return fmt.Sprintf("location type %d, id %d", loc.Type, loc.ID)
}

// MemExportFabric exports a physical allocation created with
// MemHandleTypeFabric as a fabric handle (cuMemExportToShareableHandle),
// which holds no OS resource. Handle 0 is refused (ErrInvalidArgument)
// before the driver.
func (d *Device) MemExportFabric(h MemHandle) (MemFabricHandle, error) {
	const op = "cuMemExportToShareableHandle"
	var fh MemFabricHandle
	if err := refuseZeroHandle(op, h); err != nil {
		return fh, err
	}
	ctx, err := d.contextFor(op)
	if err != nil {
		return fh, err
	}
	p := &d.drv.MemExportToShareableHandle
	if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&fh)), uintptr(h), uintptr(MemHandleTypeFabric), 0); !ok(r) {
		return MemFabricHandle{}, FabricError(op, fmt.Errorf("handle %#x as a fabric handle: %w", uint64(h), fail(p, r)))
	}
	return fh, zeroFabric(op, fh)
}

// zeroFabric refuses the all-zero fabric handle a successful export
// returned.
func zeroFabric(op string, fh MemFabricHandle) error {
	if fh.IsZero() {
		return &OpError{Op: op, Err: fmt.Errorf("%w: the driver reported success with an all-zero fabric handle", ErrorUnknown)}
	}
	return nil
}

// MemImportFabric imports a physical allocation from a fabric handle
// exported on a node of the same NVLink domain
// (cuMemImportFromShareableHandle). A zero handle is refused before the
// driver. Release the result with MemRelease once unmapped.
func (d *Device) MemImportFabric(fh *MemFabricHandle) (MemHandle, error) {
	const op = "cuMemImportFromShareableHandle"
	if fh == nil || fh.IsZero() {
		return 0, Errorf(op, ErrInvalidArgument, "nil or all-zero fabric handle")
	}
	ctx, err := d.contextFor(op)
	if err != nil {
		return 0, err
	}
	// The driver reads the 64 bytes from a copy on this stack frame, so
	// the caller's value cannot change under it.
	in := *fh
	var h MemHandle
	p := &d.drv.MemImportFromShareableHandle
	if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&in)), uintptr(MemHandleTypeFabric)); !ok(r) {
		return 0, FabricError(op, fmt.Errorf("%v: %w", in, fail(p, r)))
	}
	if h == 0 {
		return 0, zeroHandleErr(op, op, fmt.Sprintf("physical allocation handle for %v", in))
	}
	return h, nil
}

// ExportFabric exports the pool as a fabric handle
// (cuMemPoolExportToShareableHandle with CU_MEM_HANDLE_TYPE_FABRIC); the
// pool must have been created with MemHandleTypeFabric in its handle types.
func (p MemPool) ExportFabric() (MemFabricHandle, error) {
	const op = "cuMemPoolExportToShareableHandle"
	var fh MemFabricHandle
	ctx, err := p.ctx(op)
	if err != nil {
		return fh, err
	}
	pr := &p.drv().MemPoolExportToShareableHandle
	if r := pr.CallCtx(ctx, uintptr(unsafe.Pointer(&fh)), p.handle, uintptr(MemHandleTypeFabric), 0); !ok(r) {
		return MemFabricHandle{}, FabricError(op, fmt.Errorf("pool as a fabric handle: %w", fail(pr, r)))
	}
	return fh, zeroFabric(op, fh)
}

// ImportMemPoolFabric imports a pool exported as a fabric handle
// (cuMemPoolImportFromShareableHandle), checking the handle as
// MemImportFabric does.
func (d *Device) ImportMemPoolFabric(fh *MemFabricHandle) (MemPool, error) {
	const op = "cuMemPoolImportFromShareableHandle"
	if fh == nil || fh.IsZero() {
		return MemPool{}, Errorf(op, ErrInvalidArgument, "nil or all-zero fabric handle")
	}
	ctx, err := d.contextFor("Device.ImportMemPoolFabric")
	if err != nil {
		return MemPool{}, err
	}
	in := *fh
	var h uintptr
	p := &d.drv.MemPoolImportFromShareableHandle
	if r := p.CallCtx(ctx, uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&in)), uintptr(MemHandleTypeFabric), 0); !ok(r) {
		return MemPool{}, FabricError(op, fmt.Errorf("%v: %w", in, fail(p, r)))
	}
	if h == 0 {
		// A zero MemPool is what every pool method refuses as "no pool".
		return MemPool{}, zeroHandleErr(op, op, fmt.Sprintf("pool handle for %v", in))
	}
	return MemPool{handle: h, dev: d}, nil
}
