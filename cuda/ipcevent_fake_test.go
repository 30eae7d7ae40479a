//go:build linux

package cuda

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
)

// fakeIPCEvent is an event handle the fake driver opens: its magic, bytes
// 0..54, and 0x5a last, all of which must reach the driver as written
// (the handle is passed by value).
func fakeIPCEvent() IPCEventHandle {
	var h IPCEventHandle
	binary.LittleEndian.PutUint64(h.Reserved[:], 0x746e657663706966)
	for i := 8; i < IPCHandleSize-1; i++ {
		h.Reserved[i] = byte(i - 8)
	}
	h.Reserved[IPCHandleSize-1] = 0x5a
	return h
}

// TestIPCWaitEvent: the 64-byte handle reaches cuIpcOpenEventHandle
// whole, the event is waited for and this process's handle of it is
// destroyed (the fake's event count is back); a handle the driver refuses
// is an error naming the call, with nothing left open.
func TestIPCWaitEvent(t *testing.T) {
	f := newCtxFake(t, "12040")
	d := f.devs[0]
	events := func() int64 { return f.stat.Stat(fakecuda.Events) }
	before := events()
	require.NoError(t, d.IPCWaitEvent(fakeIPCEvent()))
	assert.Equal(t, before, events(), "the opened event was destroyed")

	for i := 0; i < IPCHandleSize; i += 9 {
		h := fakeIPCEvent()
		h.Reserved[i] ^= 0xff
		err := d.IPCWaitEvent(h)
		require.ErrorIs(t, err, ErrorInvalidValue, "byte %d changed", i)
		assert.Contains(t, err.Error(), "Device.IPCWaitEvent")
		assert.Contains(t, err.Error(), "cuIpcOpenEventHandle")
		assert.Equal(t, before, events())
	}
	var nilDev *Device
	assert.ErrorIs(t, nilDev.IPCWaitEvent(fakeIPCEvent()), ErrInvalidArgument)
}
