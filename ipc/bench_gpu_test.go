//go:build linux

package ipc_test

import (
	"errors"
	"runtime"
	"syscall"
	"testing"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/cudatest"
	"github.com/cudamem/cudamem/ipc"
	"github.com/cudamem/cudamem/resource"
)

// BenchmarkPoolCreateExport is cudamem bench's ipc/pool_create_export
// three ways, to tell where its time goes (run it with -test.cpuprofile
// on the GPU machine): through the public API; as the same driver calls
// made directly through package cuda (what the C baseline makes); and as
// those with the goroutine locked to its OS thread, as C's one thread is.
func BenchmarkPoolCreateExport(b *testing.B) {
	d := cudatest.Device(b)
	s := cudatest.Stream(b, d)
	b.Run("api", func(b *testing.B) {
		for b.Loop() {
			if err := poolCreateExportAPI(d, s); err != nil {
				b.Fatal(err)
			}
		}
	})
	raw := func(b *testing.B) {
		for b.Loop() {
			if err := poolCreateExportRaw(d, s); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("raw", raw)
	b.Run("raw-locked", func(b *testing.B) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		raw(b)
	})
}

func poolCreateExportAPI(d *cuda.Device, s *cuda.Stream) (err error) {
	p, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{IPC: true})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, p.Close()) }()
	h, err := ipc.ExportPool(p)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, h.Close()) }()
	buf, err := p.Allocate(1<<20, s)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, buf.Close()) }()
	_, err = ipc.ExportBuffer(buf)
	return err
}

// poolCreateExportRaw makes testdata/cgobench's cb_ipc_pool_create_export
// calls, in its order.
func poolCreateExportRaw(d *cuda.Device, s *cuda.Stream) error {
	props := cuda.MemPoolProps{
		AllocType:   cuda.MemAllocationTypePinned,
		HandleTypes: cuda.MemHandleTypePosixFileDescriptor,
		Location:    cuda.MemLocation{Type: cuda.MemLocationTypeDevice, ID: int32(d.Ordinal())},
	}
	pool, err := d.CreateMemPool(&props)
	if err != nil {
		return err
	}
	if err := pool.SetAttribute(cuda.MemPoolAttrReleaseThreshold, ^uint64(0)); err != nil {
		return err
	}
	fd, err := pool.ExportFD()
	if err != nil {
		return err
	}
	p, err := s.MemAllocFromPoolAsync(pool, 1<<20)
	if err != nil {
		return err
	}
	if err := s.Sync(); err != nil {
		return err
	}
	if _, err := pool.ExportPointer(p); err != nil {
		return err
	}
	if err := s.MemFreeAsync(p); err != nil {
		return err
	}
	if err := syscall.Close(fd); err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		return err
	}
	return pool.Destroy()
}
