package resource

import (
	"fmt"
	"reflect"
	"sync"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// defaultEntry is a device's default resource; auto marks one Default
// made itself (and may make again if it was closed).
type defaultEntry struct {
	mr   buffer.MemoryResource
	auto bool
}

var defaults = struct {
	mu sync.Mutex
	m  map[*cuda.Device]defaultEntry
}{m: make(map[*cuda.Device]defaultEntry)}

// Default returns dev's default memory resource, as RMM's per-device
// resource and cuda.core's Device.memory_resource do. Unless SetDefault
// chose another, it is made on first use: a DevicePool on the device's
// current pool when the device supports memory pools, a SyncDevice
// otherwise (the choice cuda.core asks for). The automatic pool is
// not owned, so closing it destroys nothing; Default makes a new one if it
// was closed. Default is safe for concurrent use.
func Default(dev *cuda.Device) (buffer.MemoryResource, error) {
	const op = "Default"
	if err := checkDevice(op, dev); err != nil {
		return nil, err
	}
	defaults.mu.Lock()
	defer defaults.mu.Unlock()
	e, ok := defaults.m[dev]
	if ok && !(e.auto && isClosed(e.mr)) {
		return e.mr, nil
	}
	f, err := dev.Features()
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: fmt.Errorf("%v features: %w", dev, err)}
	}
	var mr buffer.MemoryResource
	if f.MemoryPools {
		mr, err = CurrentDevicePool(dev)
	} else {
		mr, err = NewSyncDevice(dev)
	}
	if err != nil {
		return nil, &cuda.OpError{Op: op, Err: err}
	}
	defaults.m[dev] = defaultEntry{mr: mr, auto: true}
	return mr, nil
}

// isClosed reports whether mr is a resource Default made and it was closed.
func isClosed(mr buffer.MemoryResource) bool {
	p, ok := mr.(*DevicePool)
	return ok && p.IsClosed()
}

// SetDefault makes mr dev's default resource. The previous default is not
// closed (code that holds it may still use it). mr must be bound to dev
// or to no device (DeviceID -1, as pinned host memory is); a nil device or
// resource is an error matching cuda.ErrInvalidArgument, and a closed one
// (a resource whose IsClosed reports true) an error matching
// cuda.ErrClosed.
func SetDefault(dev *cuda.Device, mr buffer.MemoryResource) error {
	const op = "SetDefault"
	if err := checkDevice(op, dev); err != nil {
		return err
	}
	if mr == nil || holdsNil(mr) {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "nil memory resource for %v", dev)
	}
	if c, ok := mr.(interface{ IsClosed() bool }); ok && c.IsClosed() {
		return &cuda.OpError{Op: op, Err: fmt.Errorf("resource %v for %v: %w", mr, dev, cuda.ErrClosed)}
	}
	if id := mr.DeviceID(); id != -1 && id != dev.Ordinal() {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "resource %v belongs to GPU %d, not %v", mr, id, dev)
	}
	defaults.mu.Lock()
	defer defaults.mu.Unlock()
	defaults.m[dev] = defaultEntry{mr: mr}
	return nil
}

// holdsNil reports whether x is nil or holds a nil pointer, map, slice,
// function or channel (of any type, so resources from other packages are
// caught too).
func holdsNil(x any) bool {
	v := reflect.ValueOf(x)
	if !v.IsValid() {
		return true
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return v.IsNil()
	}
	return false
}
