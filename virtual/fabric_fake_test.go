package virtual

import (
	"encoding/binary"

	"github.com/cudamem/cudamem/cuda"
)

// fakeFabric is the fake driver's model of fabric handles and of the
// properties it reads back. The zero value: the device supports fabric
// handles and they work (IMEX present).
type fakeFabric struct {
	noAttr bool        // the device reports no fabric support
	refuse cuda.Result // non-zero: fabric memory, exports and imports fail so (no IMEX)

	props    map[cuda.MemHandle]cuda.MemAllocationProp
	exported map[cuda.MemFabricHandle]cuda.MemHandle
	retains  map[cuda.MemHandle]int
	serial   uint64
}

func (ff *fakeFabric) refused(op string, prop *cuda.MemAllocationProp) error {
	if prop.RequestedHandleTypes&cuda.MemHandleTypeFabric != 0 && ff.refuse != 0 {
		return &cuda.OpError{Op: op, Err: ff.refuse}
	}
	return nil
}

func (ff *fakeFabric) created(h cuda.MemHandle, prop *cuda.MemAllocationProp) {
	if ff.props == nil {
		ff.props = map[cuda.MemHandle]cuda.MemAllocationProp{}
	}
	ff.props[h] = *prop
}

// unretain consumes one retain of h, if it has one.
func (ff *fakeFabric) unretain(h cuda.MemHandle) bool {
	if ff.retains[h] == 0 {
		return false
	}
	ff.retains[h]--
	return true
}

func (f *fakeDriver) FabricHandlesSupported() (bool, error) {
	if err := f.call("cuDeviceGetAttribute"); err != nil {
		return false, err
	}
	return !f.fab.noAttr, nil
}

func (f *fakeDriver) MemExportFabric(h cuda.MemHandle) (cuda.MemFabricHandle, error) {
	if err := f.call("cuMemExportToShareableHandle"); err != nil {
		return cuda.MemFabricHandle{}, err
	}
	if fh, ok := f.handles[h]; !ok || fh.released {
		return cuda.MemFabricHandle{}, f.misuse("fabric export of handle %#x: not live", uint64(h))
	}
	if f.fab.props[h].RequestedHandleTypes&cuda.MemHandleTypeFabric == 0 {
		return cuda.MemFabricHandle{}, &cuda.OpError{Op: "cuMemExportToShareableHandle", Err: cuda.ErrorInvalidValue}
	}
	if f.fab.refuse != 0 {
		return cuda.MemFabricHandle{}, &cuda.OpError{Op: "cuMemExportToShareableHandle", Err: f.fab.refuse}
	}
	f.fab.serial++
	var out cuda.MemFabricHandle
	copy(out.Data[:], "fakefab!")
	binary.LittleEndian.PutUint64(out.Data[8:], f.fab.serial)
	binary.LittleEndian.PutUint64(out.Data[16:], uint64(h))
	if f.fab.exported == nil {
		f.fab.exported = map[cuda.MemFabricHandle]cuda.MemHandle{}
	}
	f.fab.exported[out] = h
	return out, nil
}

func (f *fakeDriver) MemImportFabric(fh *cuda.MemFabricHandle) (cuda.MemHandle, error) {
	if err := f.call("cuMemImportFromShareableHandle"); err != nil {
		return 0, err
	}
	if f.fab.refuse != 0 {
		return 0, &cuda.OpError{Op: "cuMemImportFromShareableHandle", Err: f.fab.refuse}
	}
	src, ok := f.fab.exported[*fh]
	if !ok {
		// Unknown bytes: the real driver refuses them too. Not a misuse
		// by the library: it cannot tell a real handle from garbage.
		return 0, &cuda.OpError{Op: "cuMemImportFromShareableHandle", Err: cuda.ErrorInvalidValue}
	}
	sh, live := f.handles[src]
	if !live {
		return 0, &cuda.OpError{Op: "cuMemImportFromShareableHandle", Err: cuda.ErrorInvalidValue}
	}
	f.nextH++
	f.handles[f.nextH] = fakeHandle{size: sh.size}
	prop := f.fab.props[src]
	f.fab.created(f.nextH, &prop)
	return f.nextH, nil
}

func (f *fakeDriver) MemAllocationProperties(h cuda.MemHandle) (cuda.MemAllocationProp, error) {
	if err := f.call("cuMemGetAllocationPropertiesFromHandle"); err != nil {
		return cuda.MemAllocationProp{}, err
	}
	if fh, ok := f.handles[h]; !ok || fh.released && f.fab.retains[h] == 0 {
		return cuda.MemAllocationProp{}, f.misuse("properties of handle %#x: not live", uint64(h))
	}
	if p, ok := f.fab.props[h]; ok {
		return p, nil
	}
	// Imported from an fd: device memory shareable as fds.
	return cuda.MemAllocationProp{Type: cuda.MemAllocationTypePinned, RequestedHandleTypes: cuda.MemHandleTypePosixFileDescriptor,
		Location: cuda.MemLocation{Type: cuda.MemLocationTypeDevice}}, nil
}

func (f *fakeDriver) MemRetainAllocationHandle(addr cuda.DevicePtr) (cuda.MemHandle, error) {
	if err := f.call("cuMemRetainAllocationHandle"); err != nil {
		return 0, err
	}
	for p, m := range f.maps {
		if addr >= p && uint64(addr-p) < m.size {
			if f.fab.retains == nil {
				f.fab.retains = map[cuda.MemHandle]int{}
			}
			f.fab.retains[m.h]++
			return m.h, nil
		}
	}
	return 0, &cuda.OpError{Op: "cuMemRetainAllocationHandle", Err: cuda.ErrorInvalidValue}
}

func (l *lockedFake) FabricHandlesSupported() (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.FabricHandlesSupported()
}

func (l *lockedFake) MemExportFabric(h cuda.MemHandle) (cuda.MemFabricHandle, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.MemExportFabric(h)
}

func (l *lockedFake) MemImportFabric(fh *cuda.MemFabricHandle) (cuda.MemHandle, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.MemImportFabric(fh)
}

func (l *lockedFake) MemAllocationProperties(h cuda.MemHandle) (cuda.MemAllocationProp, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.MemAllocationProperties(h)
}

func (l *lockedFake) MemRetainAllocationHandle(addr cuda.DevicePtr) (cuda.MemHandle, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.MemRetainAllocationHandle(addr)
}
