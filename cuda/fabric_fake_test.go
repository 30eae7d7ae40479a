package cuda

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
)

// fabricLocations are the pool locations of every type the driver takes.
var fabricLocations = []MemLocation{
	{Type: MemLocationTypeDevice, ID: 1},
	{Type: MemLocationTypeHost},
	{Type: MemLocationTypeHostNUMA, ID: 0},
	{Type: MemLocationTypeHostNUMACurrent},
}

// Without IMEX the fake (as the real driver) makes a pool with fabric
// handles at any location, refuses its export, and crashes on its
// destruction. CreateMemPool probes at the pool's own location first, so
// no such pool is made at any location type: the error names IMEX and
// keeps the driver's Result, and nothing is left behind.
func TestCreateMemPoolFabricProbesEveryLocation(t *testing.T) {
	fk := newCtxFake(t, "13000")
	d := fk.devs[1]
	_, err := d.context() // retained once: not part of the baselines
	require.NoError(t, err)
	for _, tc := range []struct {
		mode fakecuda.FabricMode
		res  Result
	}{{fakecuda.FabricNoIMEX, ErrorNotPermitted}, {fakecuda.FabricUnsupported, ErrorNotSupported}} {
		fk.stat.SetFabric(tc.mode)
		for _, loc := range fabricLocations {
			base := fk.stat.Snapshot()
			p, err := d.CreateMemPool(&MemPoolProps{AllocType: MemAllocationTypePinned, HandleTypes: MemHandleTypeFabric, Location: loc})
			if err == nil {
				// Before the probe covered this location: the pool is the
				// doomed one. Its destruction is the crash.
				derr := p.Destroy()
				t.Fatalf("mode %d, %s: a pool with fabric handles was made (its Destroy: %v; fake crashes: %d)",
					tc.mode, locationName(loc), derr, fk.stat.Stat(fakecuda.Crashes))
			}
			msg := err.Error()
			assert.ErrorIs(t, err, ErrNotSupported, "mode %d, %s", tc.mode, locationName(loc))
			assert.ErrorIs(t, err, tc.res, "mode %d, %s: the driver's Result", tc.mode, locationName(loc))
			assert.Contains(t, msg, "IMEX")
			assert.Contains(t, msg, "cuMemPoolCreate")
			assert.Contains(t, msg, locationName(loc))
			assert.Empty(t, fk.stat.Snapshot().Diff(base), "mode %d, %s: the probe left nothing behind", tc.mode, locationName(loc))
		}
	}
	assert.Zero(t, fk.stat.Stat(fakecuda.Crashes))

	// Where fabric handles work, the probe passes and the pool is made,
	// exported and destroyed at each location the fake's pools take.
	fk.stat.SetFabric(fakecuda.FabricWorks)
	for _, loc := range fabricLocations[:3] {
		base := fk.stat.Snapshot()
		p, err := d.CreateMemPool(&MemPoolProps{AllocType: MemAllocationTypePinned, HandleTypes: MemHandleTypeFabric, Location: loc})
		require.NoError(t, err, locationName(loc))
		fh, err := p.ExportFabric()
		require.NoError(t, err)
		assert.False(t, fh.IsZero())
		require.NoError(t, p.Destroy())
		assert.Empty(t, fk.stat.Snapshot().Diff(base))
	}
	fk.stat.SetFabric(fakecuda.FabricNoIMEX)
	assert.Zero(t, fk.stat.Stat(fakecuda.Crashes))
}

// CheckFabricAt probes where it is asked to; CheckFabric on the device.
func TestCheckFabricAt(t *testing.T) {
	fk := newCtxFake(t, "13000")
	d := fk.devs[0]
	for _, loc := range fabricLocations {
		err := d.CheckFabricAt(loc)
		assert.ErrorIs(t, err, ErrNotSupported)
		assert.ErrorIs(t, err, ErrorNotPermitted)
		assert.Contains(t, err.Error(), "Device.CheckFabricAt")
		assert.Contains(t, err.Error(), locationName(loc))
	}
	fk.stat.SetFabric(fakecuda.FabricWorks)
	defer fk.stat.SetFabric(fakecuda.FabricNoIMEX)
	assert.NoError(t, d.CheckFabric())
	assert.NoError(t, d.CheckFabricAt(MemLocation{Type: MemLocationTypeHostNUMA}))
	assert.Zero(t, fk.stat.Stat(fakecuda.VMMHandles), "the probe granule is released")
	for _, bad := range []*Device{nil, {}} {
		assert.ErrorIs(t, bad.CheckFabricAt(MemLocation{Type: MemLocationTypeHost}), ErrInvalidArgument)
	}
}

// stubFabric answers the probe's calls from fields.
type stubFabric struct {
	noAttr      bool
	attrErr     error
	createErr   error
	exportErr   error
	releaseErrs int // the first n releases fail
	created     []MemAllocationProp
	released    int
}

func (s *stubFabric) FabricHandlesSupported() (bool, error) { return !s.noAttr, s.attrErr }
func (s *stubFabric) AllocationGranularity(*MemAllocationProp, MemAllocationGranularity) (uint64, error) {
	return 2 << 20, nil
}
func (s *stubFabric) MemCreate(size uint64, prop *MemAllocationProp) (MemHandle, error) {
	if s.createErr != nil {
		return 0, s.createErr
	}
	s.created = append(s.created, *prop)
	return 7, nil
}
func (s *stubFabric) MemExportFabric(MemHandle) (MemFabricHandle, error) {
	return testFabricHandle(), s.exportErr
}
func (s *stubFabric) MemRelease(MemHandle) error {
	if s.releaseErrs > 0 {
		s.releaseErrs--
		return &OpError{Op: "cuMemRelease", Err: ErrorUnknown}
	}
	s.released++
	return nil
}

// CheckFabricWith: the one probe, through any FabricCalls. The host and
// host-NUMA-current location types, which the driver refuses for
// shareable memory with CUDA_ERROR_INVALID_VALUE, count as unsupported;
// the same answer elsewhere, and other errors, are returned as they are.
func TestCheckFabricWith(t *testing.T) {
	host := MemAllocationProp{Location: MemLocation{Type: MemLocationTypeHost}}
	numa := MemAllocationProp{Location: MemLocation{Type: MemLocationTypeHostNUMA, ID: 3}}
	rdma := MemAllocationProp{Location: MemLocation{Type: MemLocationTypeDevice, ID: 1}}
	rdma.AllocFlags.GPUDirectRDMACapable = 1

	s := &stubFabric{}
	require.NoError(t, CheckFabricWith(s, rdma))
	require.Len(t, s.created, 1)
	got := s.created[0]
	assert.Equal(t, MemAllocationTypePinned, got.Type)
	assert.Equal(t, MemHandleTypeFabric, got.RequestedHandleTypes)
	assert.Equal(t, rdma.Location, got.Location)
	assert.EqualValues(t, 1, got.AllocFlags.GPUDirectRDMACapable, "the caller's flags are kept")
	assert.Equal(t, 1, s.released)

	invalid := &OpError{Op: "cuMemCreate", Err: ErrorInvalidValue}
	for _, loc := range []MemLocation{{Type: MemLocationTypeHost}, {Type: MemLocationTypeHostNUMACurrent}} {
		err := CheckFabricWith(&stubFabric{createErr: invalid}, MemAllocationProp{Location: loc})
		assert.ErrorIs(t, err, ErrNotSupported, locationName(loc))
		assert.ErrorIs(t, err, ErrorInvalidValue)
		// The location type, not a missing IMEX service, is the reason.
		assert.NotContains(t, err.Error(), "IMEX")
		assert.Contains(t, err.Error(), "takes no fabric-shareable memory at "+locationName(loc))
		assert.Equal(t, 1, strings.Count(err.Error(), " at "+locationName(loc)), "the location is named once: %v", err)
	}
	err := CheckFabricWith(&stubFabric{createErr: invalid}, numa)
	assert.NotErrorIs(t, err, ErrNotSupported, "an invalid NUMA node is not a fabric refusal")
	assert.ErrorIs(t, err, ErrorInvalidValue)
	assert.Contains(t, err.Error(), "host NUMA node 3")

	err = CheckFabricWith(&stubFabric{noAttr: true}, host)
	assert.ErrorIs(t, err, ErrNotSupported)
	assert.ErrorIs(t, err, ErrorNotSupported)
	assert.Contains(t, err.Error(), "IMEX")
	err = CheckFabricWith(&stubFabric{attrErr: ErrorDeinitialized}, host)
	assert.ErrorIs(t, err, ErrorDeinitialized)
	assert.NotErrorIs(t, err, ErrNotSupported)
	s = &stubFabric{exportErr: &OpError{Op: "cuMemExportToShareableHandle", Err: ErrorNotPermitted}}
	err = CheckFabricWith(s, numa)
	assert.ErrorIs(t, err, ErrNotSupported)
	assert.ErrorIs(t, err, ErrorNotPermitted)
	assert.Equal(t, 1, s.released, "released after a refused export")
	s = &stubFabric{releaseErrs: 1}
	require.NoError(t, CheckFabricWith(s, numa), "a release that fails once is retried")
	assert.Equal(t, 1, s.released)
	s = &stubFabric{releaseErrs: 2}
	err = CheckFabricWith(s, numa)
	assert.ErrorIs(t, err, ErrorUnknown)
	assert.True(t, strings.Contains(err.Error(), "releasing the probe allocation"), err.Error())
	err = CheckFabricWith(&stubFabric{createErr: &OpError{Op: "cuMemCreate", Err: ErrorOutOfMemory}}, rdma)
	assert.ErrorIs(t, err, ErrorOutOfMemory)
	assert.NotErrorIs(t, err, ErrNotSupported)

	err = CheckFabricWith(nil, host)
	assert.ErrorIs(t, err, ErrInvalidArgument)
	var nilDev *Device
	assert.ErrorIs(t, CheckFabricWith(nilDev, host), ErrInvalidArgument)
	assert.False(t, errors.Is(CheckFabricWith(&stubFabric{}, host), ErrNotSupported))
}
