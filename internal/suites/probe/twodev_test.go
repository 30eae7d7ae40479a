//go:build linux

package probe

import (
	"errors"
	"slices"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// The two-GPU paths, on the fake driver's two devices: what the GPU suite's
// two-GPU tests check, for the machines that have one GPU.

// TestTwoDevicesPeerCopy copies a buffer of GPU 0's to GPU 1's and back,
// through owned pools on each, and reads the data back.
func TestTwoDevicesPeerCopy(t *testing.T) {
	t.Cleanup(baseline(t))
	d0, d1 := dev(t, 0), dev(t, 1)
	p0, err := resource.NewDevicePool(d0, &resource.DevicePoolOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p0.Close()
	p1, err := resource.NewDevicePool(d1, &resource.DevicePoolOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p1.Close()
	s0, err := d0.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s0.Close()

	const n = 1 << 12
	src := make([]uint32, n)
	for i := range src {
		src[i] = uint32(i)*2654435761 ^ 0x5eed
	}
	a, err := p0.Allocate(4*n, s0)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p1.Allocate(4*n, nil) // GPU 1's memory, on its own default stream
	if err != nil {
		t.Fatal(err)
	}
	if err := d1.Sync(); err != nil { // allocated before s0 uses it
		t.Fatal(err)
	}
	c, err := p0.Allocate(4*n, s0)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		closeAll(t, a, c)
		if err := b.CloseOn(s0); err != nil { // freed after s0's copies
			t.Error(err)
		}
		if err := s0.Sync(); err != nil {
			t.Error(err)
		}
	}()
	if err := buffer.CopyFromHost(a, src, s0); err != nil {
		t.Fatal(err)
	}
	if err := a.CopyTo(b, s0); err != nil {
		t.Fatalf("GPU 0 → GPU 1: %v", err)
	}
	if err := c.CopyFrom(b, s0); err != nil {
		t.Fatalf("GPU 1 → GPU 0: %v", err)
	}
	got := make([]uint32, n)
	if err := buffer.CopyToHost(got, c, s0); err != nil {
		t.Fatal(err)
	}
	if err := s0.Sync(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, src) {
		t.Fatal("the data that went to GPU 1 and back differs")
	}
}

// TestTwoDevicesPoolPeerAccess grants GPU 1 access to a pool of GPU 0's,
// reads it back, and revokes it.
func TestTwoDevicesPoolPeerAccess(t *testing.T) {
	t.Cleanup(baseline(t))
	d0, d1 := dev(t, 0), dev(t, 1)
	if ok, err := d0.CanAccessPeer(d1); err != nil || !ok {
		t.Fatalf("the fake's GPUs should reach each other: %v, %v", ok, err)
	}
	p, err := resource.NewDevicePool(d0, &resource.DevicePoolOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	peers, err := p.PeerAccess()
	if err != nil || len(peers) != 0 {
		t.Fatalf("a new pool's peers: %v, %v; want none", peers, err)
	}
	if err := p.SetPeerAccess(d1); err != nil {
		t.Fatal(err)
	}
	if peers, err = p.PeerAccess(); err != nil || !slices.Equal(peers, []int{1}) {
		t.Fatalf("after SetPeerAccess(GPU 1): %v, %v; want [1]", peers, err)
	}
	if err := p.SetPeerAccess(d0); !errors.Is(err, cuda.ErrInvalidArgument) {
		t.Fatalf("SetPeerAccess(the pool's own device): %v; want ErrInvalidArgument", err)
	}
	if peers, err = p.PeerAccess(); err != nil || !slices.Equal(peers, []int{1}) {
		t.Fatalf("a refused SetPeerAccess changed the peers: %v, %v", peers, err)
	}
	if err := p.SetPeerAccess(); err != nil {
		t.Fatal(err)
	}
	if peers, err = p.PeerAccess(); err != nil || len(peers) != 0 {
		t.Fatalf("after SetPeerAccess(): %v, %v; want none", peers, err)
	}
}

// TestTwoDevicesOtherDeviceStream: a pool and a sub-allocator of GPU 0
// refuse a stream of GPU 1, whether the sub-allocator's cache holds a
// range or not, and nothing is allocated.
func TestTwoDevicesOtherDeviceStream(t *testing.T) {
	t.Cleanup(baseline(t))
	d0, d1 := dev(t, 0), dev(t, 1)
	p, err := resource.NewDevicePool(d0, &resource.DevicePoolOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	sa, err := resource.NewSubAllocator(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer sa.Close()
	s1, err := d1.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	defer s1.Close()
	if b, err := p.Allocate(256, s1); !errors.Is(err, cuda.ErrInvalidArgument) {
		closeAll(t, b)
		t.Fatalf("DevicePool of GPU 0 on a GPU 1 stream: %v; want ErrInvalidArgument", err)
	}
	for _, warm := range []bool{false, true} {
		if warm { // a range freed on the default stream sits in the cache
			b, err := sa.Allocate(256, nil)
			if err != nil {
				t.Fatal(err)
			}
			closeAll(t, b)
		}
		if b, err := sa.Allocate(256, s1); !errors.Is(err, cuda.ErrInvalidArgument) {
			closeAll(t, b)
			t.Fatalf("SubAllocator of GPU 0 on a GPU 1 stream (cache warm: %v): %v; want ErrInvalidArgument", warm, err)
		}
	}
	if err := d0.Sync(); err != nil {
		t.Fatal(err)
	}
}
