package virtual

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
)

// propsDriver reports the given properties for every handle the fake
// imported from an fd: what a peer's descriptor may turn out to hold.
type propsDriver struct {
	*fakeDriver
	prop     cuda.MemAllocationProp
	imported map[cuda.MemHandle]bool
}

func (p *propsDriver) MemImportFD(fd int) (cuda.MemHandle, error) {
	h, err := p.fakeDriver.MemImportFD(fd)
	if err == nil {
		p.imported[h] = true
	}
	return h, err
}

func (p *propsDriver) MemAllocationProperties(h cuda.MemHandle) (cuda.MemAllocationProp, error) {
	prop, err := p.fakeDriver.MemAllocationProperties(h)
	if err != nil || !p.imported[h] {
		return prop, err
	}
	return p.prop, nil
}

// TestImportChecksImportedProperties: Import passed a peer's fds to the
// driver and mapped whatever came back. As ImportFabric does, it now
// reads the imported memory's properties back and refuses memory that is
// not VMM memory, or that lives elsewhere than the resource's memory (on
// the host for a device resource, or the reverse), giving back all it
// imported, mapped and reserved; memory that fits is imported.
func TestImportChecksImportedProperties(t *testing.T) {
	dev := cuda.MemLocation{Type: cuda.MemLocationTypeDevice}
	host := cuda.MemLocation{Type: cuda.MemLocationTypeHost}
	for _, tc := range []struct {
		name string
		loc  LocationType
		prop cuda.MemAllocationProp
		want string // "" means imported
	}{
		{"device memory", OnDevice, cuda.MemAllocationProp{Type: cuda.MemAllocationTypePinned, Location: dev}, ""},
		{"host memory into a device resource", OnDevice, cuda.MemAllocationProp{Type: cuda.MemAllocationTypePinned, Location: host}, "located at"},
		{"device memory into a host resource", OnHost, cuda.MemAllocationProp{Type: cuda.MemAllocationTypePinned, Location: dev}, "located at"},
		{"not VMM memory", OnDevice, cuda.MemAllocationProp{Type: cuda.MemAllocationType(0x7f), Location: dev}, "not VMM memory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake(testGran)
			p := &propsDriver{fakeDriver: f, prop: tc.prop, imported: map[cuda.MemHandle]bool{}}
			r, err := newResource(p, fakeDevice, &Options{HandleType: HandlePosixFD, Location: tc.loc})
			require.NoError(t, err)
			fds := devNullFDs(t, 2)
			nb, err := r.Import([]Chunk{{FD: fds[0], Size: testGran}, {FD: fds[1], Size: testGran}}, 2*testGran)
			if tc.want == "" {
				require.NoError(t, err)
				checkInvariants(t, r, f)
				closeAll(t, r, f, nb)
				return
			}
			require.Nil(t, nb)
			require.ErrorIs(t, err, cuda.ErrInvalidArgument)
			require.Contains(t, err.Error(), "virtual.Import")
			require.Contains(t, err.Error(), tc.want)
			require.Contains(t, err.Error(), "chunk 0", "the first chunk is refused")
			require.NoError(t, r.Reclaim())
			require.Empty(t, r.Live())
			f.requireEmpty(t)
		})
	}
}
