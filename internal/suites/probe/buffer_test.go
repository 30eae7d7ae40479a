//go:build linux

package probe

import (
	"errors"
	"io"
	"math"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

func resources(t *testing.T) map[string]buffer.MemoryResource {
	t.Helper()
	d0 := dev(t, 0)
	out := map[string]buffer.MemoryResource{}
	def, err := resource.Default(d0)
	if err != nil {
		t.Fatal(err)
	}
	out["default"] = def
	dp, err := resource.CurrentDevicePool(d0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	out["devicepool"] = dp
	pp, err := resource.NewPinnedPool(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pp.Close() })
	out["pinnedpool"] = pp
	mg, err := resource.NewManaged(d0, nil)
	if err != nil {
		t.Fatal(err)
	}
	out["managed"] = mg
	sd, err := resource.NewSyncDevice(d0)
	if err != nil {
		t.Fatal(err)
	}
	out["sync"] = sd
	lp, err := resource.NewLegacyPinned()
	if err != nil {
		t.Fatal(err)
	}
	out["legacypinned"] = lp
	sa, err := resource.NewSubAllocator(sd, &resource.SubAllocatorOptions{GrowSize: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sa.Close() })
	out["suballoc"] = sa
	out["limiting"] = resource.NewLimiting(sd, 1<<20)
	out["statistics"] = resource.NewStatistics(sd)
	out["tracking"] = resource.NewTracking(sd, nil)
	return out
}

func TestAllocateHostileSizes(t *testing.T) {
	for name, mr := range resources(t) {
		for _, size := range []uint64{1 << 63, math.MaxUint64, math.MaxUint64 - 255, 1<<64 - 4096, 1 << 62} {
			noPanic(t, name, func() {
				b, err := buffer.Allocate(mr, size, nil)
				if err == nil {
					t.Errorf("%s.Allocate(%d): no error", name, size)
					b.Close()
					return
				}
				wantErr(t, name, err, "")
				t.Logf("%s.Allocate(%d): %v", name, size, err)
			})
		}
		for _, size := range []uint64{0, 1, 3} {
			b, err := buffer.Allocate(mr, size, nil)
			if err != nil {
				t.Errorf("%s.Allocate(%d): %v", name, size, err)
				continue
			}
			if b.Size() != size {
				t.Errorf("%s.Allocate(%d): size %d", name, size, b.Size())
			}
			closeAll(t, b)
		}
	}
}

func TestAllocateClosedStream(t *testing.T) {
	d0 := dev(t, 0)
	s, err := d0.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	for name, mr := range resources(t) {
		for _, st := range []*cuda.Stream{s, new(cuda.Stream)} {
			noPanic(t, name, func() {
				b, err := buffer.Allocate(mr, 64, st)
				if err == nil {
					t.Errorf("%s.Allocate on closed/zero stream: no error", name)
					b.Close()
					return
				}
				wantErr(t, name, err, "")
				t.Logf("%s: %v", name, err)
			})
		}
	}
}

func TestDeallocateForeign(t *testing.T) {
	for name, mr := range resources(t) {
		noPanic(t, name, func() {
			b, err := buffer.Allocate(mr, 256, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			// a pointer never handed out
			err = mr.Deallocate(b.Ptr()+1<<40, 256, nil)
			if err == nil {
				t.Errorf("%s.Deallocate(foreign): no error", name)
			} else {
				wantErr(t, name, err, "")
			}
			err = mr.Deallocate(0xdead0000, 16, nil)
			if err == nil {
				t.Errorf("%s.Deallocate(0xdead0000): no error", name)
			}
		})
	}
}

func TestDoubleDeallocate(t *testing.T) {
	for name, mr := range resources(t) {
		noPanic(t, name, func() {
			b, err := buffer.Allocate(mr, 256, nil)
			if err != nil {
				t.Fatal(err)
			}
			p, n := b.Ptr(), b.Size()
			if _, _, err := b.Disown(); err != nil {
				t.Fatalf("%s disown: %v", name, err)
			}
			if err := mr.Deallocate(p, n, nil); err != nil {
				t.Errorf("%s first deallocate: %v", name, err)
			}
			err = mr.Deallocate(p, n, nil)
			if err == nil {
				t.Errorf("%s.Deallocate twice: no error", name)
			} else {
				t.Logf("%s double: %v", name, err)
			}
		})
	}
}

func TestViewsAndOffsets(t *testing.T) {
	d0 := dev(t, 0)
	mr, _ := resource.Default(d0)
	b, err := buffer.Allocate(mr, 4096, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	for _, c := range [][2]uint64{{1, math.MaxUint64}, {math.MaxUint64, 1}, {4096, 1}, {4097, 0}, {1 << 63, 1 << 63}} {
		v, err := b.Slice(c[0], c[1])
		if err == nil {
			t.Errorf("Slice(%d,%d): no error", c[0], c[1])
			v.Close()
		} else {
			wantErr(t, "slice", err, "Buffer.Slice")
		}
	}
	v, err := b.Slice(4096, 0)
	if err != nil {
		t.Errorf("Slice(4096,0): %v", err)
	} else {
		v.Close()
	}
	v1, _ := b.Slice(1, 100)
	defer v1.Close()
	vv, err := v1.Slice(99, math.MaxUint64-98)
	if err == nil {
		t.Errorf("view Slice overflow: no error %v", vv)
	}
	if err := v1.Fill16(1, nil); err == nil {
		t.Errorf("Fill16 on odd-addressed view: no error")
	}
	v2, _ := b.Slice(2, 6)
	if err := v2.Fill32(1, nil); err == nil {
		t.Errorf("Fill32 on 6-byte view: no error")
	} else {
		wantErr(t, "fill32", err, "Buffer.Fill32")
	}
	// ReadAt / WriteAt
	p := make([]byte, 10)
	for _, off := range []int64{-1, math.MinInt64} {
		if _, err := b.ReadAt(p, off); err == nil || err == io.EOF {
			t.Errorf("ReadAt(off=%d): %v", off, err)
		}
		if _, err := b.WriteAt(p, off); err == nil {
			t.Errorf("WriteAt(off=%d): no error", off)
		}
	}
	n, err := b.ReadAt(p, math.MaxInt64)
	if n != 0 || err != io.EOF {
		t.Errorf("ReadAt(MaxInt64) = %d, %v", n, err)
	}
	if _, err := b.WriteAt(p, math.MaxInt64); err == nil {
		t.Errorf("WriteAt(MaxInt64): no error")
	}
	if _, err := b.WriteAt(p, 4090); err == nil {
		t.Errorf("WriteAt overrun: no error")
	}
	n, err = b.ReadAt(p, 4090)
	if n != 6 || err != io.EOF {
		t.Errorf("ReadAt tail = %d, %v", n, err)
	}
	if _, err := v1.ReadAt(p, 95); err != io.EOF {
		t.Errorf("view ReadAt tail: %v", err)
	}
	// WriteAt then ReadAt on a view reads back.
	if _, err := v1.WriteAt([]byte{1, 2, 3}, 97); err != nil {
		t.Fatal(err)
	}
	q := make([]byte, 4)
	if _, err := b.ReadAt(q, 98); err != nil || q[0] != 1 || q[2] != 3 {
		t.Errorf("view WriteAt did not land at off 98: %v %v", q, err)
	}
}

func TestHostCopyTypes(t *testing.T) {
	d0 := dev(t, 0)
	mr, _ := resource.Default(d0)
	type odd struct {
		A uint8
		B uint16
	} // size 4 with padding
	b, err := buffer.Allocate(mr, 12, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := buffer.CopyFromHost(b, []odd{{1, 2}, {3, 4}, {5, 6}}, nil); err != nil {
		t.Errorf("CopyFromHost []odd: %v", err)
	}
	if err := buffer.CopyFromHost(b, []odd{{1, 2}}, nil); err == nil {
		t.Errorf("mismatch: no error")
	} else {
		wantErr(t, "mismatch", err, "CopyFromHost")
	}
	if err := buffer.CopyFromHost(b, [][3]byte{{1, 2, 3}, {4, 5, 6}, {7, 8, 9}, {10, 11, 12}}, nil); err != nil {
		t.Errorf("[3]byte: %v", err)
	}
	var out [4][3]byte
	if err := buffer.CopyToHost(out[:], b, nil); err != nil || out[3][2] != 12 {
		t.Errorf("CopyToHost: %v %v", err, out)
	}
	if err := buffer.CopyFromHost(b, []string{"a"}, nil); err == nil {
		t.Errorf("string: no error")
	}
	if err := buffer.CopyFromHost(b, []struct{}{{}, {}}, nil); err == nil {
		t.Errorf("[]struct{}: no error for 0 bytes into 12")
	}
	z, _ := buffer.Allocate(mr, 0, nil)
	defer z.Close()
	if err := buffer.CopyFromHost(z, []struct{}{{}, {}, {}}, nil); err != nil {
		t.Errorf("[]struct{} into empty: %v", err)
	}
	if err := buffer.CopyToHost([]struct{}{{}}, z, nil); err != nil {
		t.Errorf("[]struct{} from empty: %v", err)
	}
	if err := buffer.CopyFromHost[byte](b, nil, nil); err == nil {
		t.Errorf("nil src: no error")
	}
	if err := buffer.CopyFromHost[byte](nil, []byte{1}, nil); err == nil {
		t.Errorf("nil dst: no error")
	}
	var zb buffer.Buffer
	if err := buffer.CopyToHost([]byte{1}, &zb, nil); err == nil {
		t.Errorf("zero src: no error")
	}
}

func TestClosedArguments(t *testing.T) {
	d0 := dev(t, 0)
	mr, _ := resource.Default(d0)
	a, _ := buffer.Allocate(mr, 64, nil)
	defer a.Close()
	c, _ := buffer.Allocate(mr, 64, nil)
	c.Close()
	s, _ := d0.NewStream()
	s.Close()
	for _, f := range []struct {
		name string
		fn   func() error
	}{
		{"CopyFrom(closed)", func() error { return a.CopyFrom(c, nil) }},
		{"CopyTo(closed)", func() error { return a.CopyTo(c, nil) }},
		{"Fill8(closed stream)", func() error { return a.Fill8(1, s) }},
		{"CopyFrom(closed stream)", func() error { b2, _ := buffer.Allocate(mr, 64, nil); defer b2.Close(); return a.CopyFrom(b2, s) }},
		{"CopyFromHost(closed stream)", func() error { return buffer.CopyFromHost(a, make([]byte, 64), s) }},
		{"CopyToHost(closed stream)", func() error { return buffer.CopyToHost(make([]byte, 64), a, s) }},
		{"Clone(closed stream)", func() error {
			b, err := a.Clone(nil, s)
			if err == nil {
				b.Close()
			}
			return err
		}},
		{"CloseOn(closed stream)", func() error {
			b, _ := buffer.Allocate(mr, 64, nil)
			err := b.CloseOn(s)
			if err != nil {
				b.Close()
			}
			return err
		}},
		{"Clone(zero stream)", func() error {
			b, err := a.Clone(nil, new(cuda.Stream))
			if err == nil {
				b.Close()
			}
			return err
		}},
		{"Fill8(zero stream)", func() error { return a.Fill8(1, new(cuda.Stream)) }},
	} {
		noPanic(t, f.name, func() {
			err := f.fn()
			if err == nil {
				t.Errorf("%s: no error", f.name)
				return
			}
			wantErr(t, f.name, err, "")
			t.Logf("%s: %v", f.name, err)
		})
	}
}

func TestCrossDevice(t *testing.T) {
	defer baseline(t)()
	d0, d1 := dev(t, 0), dev(t, 1)
	mr0, _ := resource.Default(d0)
	mr1, _ := resource.Default(d1)
	a, err := buffer.Allocate(mr0, 64, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := buffer.Allocate(mr1, 64, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := buffer.CopyFromHost(b, make([]byte, 64), d0.DefaultStream()); err != nil {
		t.Logf("dev1 buffer, dev0 stream host copy: %v", err)
	}
	if err := a.CopyFrom(b, d1.DefaultStream()); err != nil {
		t.Logf("cross copy: %v", err)
	}
	if err := b.Fill8(3, d0.DefaultStream()); err != nil {
		t.Logf("dev1 fill on dev0 stream: %v", err)
	}
	c, err := b.Clone(mr0, nil)
	if err != nil {
		t.Logf("clone to other dev: %v", err)
	} else {
		c.Close()
	}
	// closing dev1 buffer with a dev0 stream
	if err := b.CloseOn(d0.DefaultStream()); err != nil {
		t.Logf("CloseOn other dev stream: %v", err)
		b.Close()
	}
	a.Close()
	if !errors.Is(nil, nil) {
		t.Fatal()
	}
}
