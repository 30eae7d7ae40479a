package timeline_test

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource/timeline"
)

// Sleep and wake events recorded with Log.Record survive the JSON round
// trip with their tag and duration, leave the allocations' usage alone,
// and unknown kinds are refused.
func TestRecordSleepWake(t *testing.T) {
	l := timeline.NewLog(0)
	require.NoError(t, l.Record(timeline.Event{Kind: timeline.Alloc, Addr: 0x1000, Size: 64, Resource: "virtual"}))
	require.NoError(t, l.Record(timeline.Event{Kind: timeline.Sleep, Addr: 0x1000, Size: 64, Resource: "virtual", Tag: "kv", Duration: 3 * time.Millisecond}))
	require.NoError(t, l.Record(timeline.Event{Kind: timeline.Wake, Addr: 0x1000, Size: 64, Resource: "virtual", Tag: "kv", Duration: time.Millisecond}))
	assert.ErrorIs(t, l.Record(timeline.Event{Kind: 9}), cuda.ErrInvalidArgument)
	assert.ErrorIs(t, (*timeline.Log)(nil).Record(timeline.Event{Kind: timeline.Sleep}), cuda.ErrInvalidArgument)
	var js bytes.Buffer
	require.NoError(t, l.Trace().WriteJSON(&js))
	tr, err := timeline.ReadJSON(&js)
	require.NoError(t, err)
	require.Len(t, tr.Events, 3)
	assert.Equal(t, timeline.Sleep, tr.Events[1].Kind)
	assert.Equal(t, "kv", tr.Events[1].Tag)
	assert.Equal(t, 3*time.Millisecond, tr.Events[1].Duration)
	assert.Equal(t, timeline.Wake, tr.Events[2].Kind)
	u := tr.Usage("virtual")
	require.Len(t, u, 4)
	for _, x := range u[1:] {
		assert.Equal(t, uint64(64), x.Bytes, "a sleep or wake changes no allocation")
	}
	for _, k := range []timeline.Kind{timeline.Alloc, timeline.Free, timeline.Sleep, timeline.Wake} {
		b, err := k.MarshalText()
		require.NoError(t, err)
		var back timeline.Kind
		require.NoError(t, back.UnmarshalText(b))
		assert.Equal(t, k, back)
	}
}
