package resource_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
	"github.com/cudamem/cudamem/resource"
)

// jsonLog is a logger writing JSON records to a buffer, at Debug and up.
func jsonLog(lvl slog.Leveler) (*slog.Logger, *bytes.Buffer) {
	var out bytes.Buffer
	return slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: lvl})), &out
}

// records decodes the JSON lines in out.
func records(t *testing.T, out *bytes.Buffer) []map[string]any {
	t.Helper()
	var recs []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(out.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(line), &m), line)
		recs = append(recs, m)
	}
	return recs
}

func TestLoggingRecords(t *testing.T) {
	checkBufferLeaks(t)
	fake := newRecording()
	logger, out := jsonLog(slog.LevelDebug)
	mr := resource.NewLogging(fake, logger, &resource.LoggingOptions{Name: "pool \"A\""})
	assert.Equal(t, 7, mr.DeviceID())
	assert.True(t, mr.DeviceAccessible())
	assert.False(t, mr.HostAccessible())
	assert.Same(t, fake, mr.Upstream())
	assert.Equal(t, `Logging("pool \"A\"", fake)`, mr.String())

	b := allocOK(t, mr, 1000)
	assert.Same(t, mr, b.Resource(), "the adaptor owns its buffers")
	ptr := b.Ptr()
	closeBuf(t, b)
	empty := allocOK(t, mr, 0) // logged with address 0; its Close frees nothing
	closeBuf(t, empty)

	recs := records(t, out)
	require.Len(t, recs, 3)
	want := fmt.Sprintf("%#x", uint64(ptr))
	for i, msg := range []string{"allocate", "deallocate"} {
		r := recs[i]
		assert.Equal(t, msg, r["msg"])
		assert.Equal(t, "DEBUG", r["level"])
		assert.Equal(t, `pool "A"`, r["resource"])
		assert.Equal(t, float64(1000), r["size"])
		assert.Equal(t, want, r["addr"])
		assert.Equal(t, "0x0", r["stream"], "the nil stream is handle 0")
		assert.Equal(t, float64(7), r["device"])
		assert.Contains(t, r, "duration")
		assert.NotContains(t, r, "err")
	}
	assert.Equal(t, "allocate", recs[2]["msg"])
	assert.Equal(t, "0x0", recs[2]["addr"])
	assert.Equal(t, float64(0), recs[2]["size"])
	fake.requireEmpty(t)
}

func TestLoggingFailures(t *testing.T) {
	checkBufferLeaks(t)
	fake := newRecording()
	logger, out := jsonLog(slog.LevelDebug)
	mr := resource.NewLogging(fake, logger, nil)

	fake.fail(1, 0)
	_, err := mr.Allocate(512, nil)
	require.ErrorIs(t, err, cuda.ErrorOutOfMemory)
	assert.Equal(t, "fake.Allocate: 512 bytes: CUDA_ERROR_OUT_OF_MEMORY", err.Error(), "upstream errors come back unchanged")

	b := allocOK(t, mr, 512)
	fake.fail(0, 1)
	require.ErrorIs(t, b.Close(), cuda.ErrorInvalidValue)
	closeBuf(t, b) // the retry succeeds

	recs := records(t, out)
	require.Len(t, recs, 4)
	assert.Equal(t, "allocate", recs[0]["msg"])
	assert.Equal(t, "fake.Allocate: 512 bytes: CUDA_ERROR_OUT_OF_MEMORY", recs[0]["err"])
	assert.Equal(t, "0x0", recs[0]["addr"])
	assert.NotContains(t, recs[0], "resource", "no Name, no attribute")
	assert.NotContains(t, recs[1], "err")
	assert.Equal(t, "deallocate", recs[2]["msg"])
	assert.Contains(t, recs[2]["err"], "CUDA_ERROR_INVALID_VALUE")
	assert.Equal(t, "deallocate", recs[3]["msg"])
	assert.NotContains(t, recs[3], "err")
	fake.requireEmpty(t)
}

// TestLoggingLevels: nothing is written while the handler's level is
// above the records', and a LevelVar turns logging on and off live.
func TestLoggingLevels(t *testing.T) {
	checkBufferLeaks(t)
	fake := newRecording()
	var lv slog.LevelVar
	lv.Set(slog.LevelInfo)
	logger, out := jsonLog(&lv)
	mr := resource.NewLogging(fake, logger, nil)
	closeBuf(t, allocOK(t, mr, 64))
	assert.Zero(t, out.Len(), "Debug records under an Info handler")

	lv.Set(slog.LevelDebug)
	closeBuf(t, allocOK(t, mr, 64))
	assert.Len(t, records(t, out), 2)

	// Records at a chosen level.
	out.Reset()
	lv.Set(slog.LevelInfo)
	warn := resource.NewLogging(fake, logger, &resource.LoggingOptions{Level: slog.LevelWarn})
	closeBuf(t, allocOK(t, warn, 64))
	recs := records(t, out)
	require.Len(t, recs, 2)
	assert.Equal(t, "WARN", recs[0]["level"])
	fake.requireEmpty(t)
}

// TestLoggingDefaultLogger: a nil logger is slog.Default() at each call.
func TestLoggingDefaultLogger(t *testing.T) {
	checkBufferLeaks(t)
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	fake := newRecording()
	mr := resource.NewLogging(fake, nil, nil)
	logger, out := jsonLog(slog.LevelDebug)
	slog.SetDefault(logger) // after NewLogging: still used
	closeBuf(t, allocOK(t, mr, 64))
	assert.Len(t, records(t, out), 2)
}

// A nil *slog.LevelVar means the default level, and a zero slog.Logger
// the default logger: both panicked at the first call.
func TestLoggingNilLevelVarAndZeroLogger(t *testing.T) {
	checkBufferLeaks(t)
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	logger, out := jsonLog(slog.LevelDebug)
	slog.SetDefault(logger)
	fake := newRecording()
	mr := resource.NewLogging(fake, &slog.Logger{}, &resource.LoggingOptions{Level: (*slog.LevelVar)(nil)})
	closeBuf(t, allocOK(t, mr, 64))
	assert.Len(t, records(t, out), 2, "at Debug, on the default logger")
}

// TestLoggingStacks: Logging composes with the other adaptors both ways,
// and the counts below and above agree.
func TestLoggingStacks(t *testing.T) {
	checkBufferLeaks(t)
	fake := newRecording()
	logger, out := jsonLog(slog.LevelDebug)
	stats := resource.NewStatistics(resource.NewLogging(fake, logger, &resource.LoggingOptions{Name: "below"}))
	mr := resource.NewLogging(stats, logger, &resource.LoggingOptions{Name: "above"})
	var bufs []*buffer.Buffer
	for i := range 5 {
		bufs = append(bufs, allocOK(t, mr, uint64(100*(i+1))))
	}
	assert.Equal(t, uint64(1500), stats.Stats().CurrentBytes)
	for _, b := range bufs {
		closeBuf(t, b)
	}
	recs := records(t, out)
	require.Len(t, recs, 20)
	n := map[string]int{}
	for _, r := range recs {
		n[r["resource"].(string)+" "+r["msg"].(string)]++
	}
	assert.Equal(t, map[string]int{"below allocate": 5, "above allocate": 5, "below deallocate": 5, "above deallocate": 5}, n)
	assert.Zero(t, stats.Stats().CurrentBytes)
	fake.requireEmpty(t)
}

// Log every allocation and free at Debug. Over a device pool the upstream
// would be resource.CurrentDevicePool(dev); here a stand-in hands out
// addresses so the example runs anywhere. (The handler drops time and
// duration to keep the output stable.)
func ExampleNewLogging() {
	h := slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "duration" {
				return slog.Attr{}
			}
			return a
		},
	})
	mr := resource.NewLogging(&testutil.MadeUp{}, slog.New(h), &resource.LoggingOptions{Name: "scratch"})
	buf, err := mr.Allocate(1<<20, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	buf.Close()
	// Output:
	// level=DEBUG msg=allocate resource=scratch size=1048576 addr=0x7f0000000000 stream=0x0 device=0
	// level=DEBUG msg=deallocate resource=scratch size=1048576 addr=0x7f0000000000 stream=0x0 device=0
}
