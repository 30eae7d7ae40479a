package warn

import (
	"bytes"
	"errors"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestFailedLogsAtWarn(t *testing.T) {
	var buf bytes.Buffer
	old := slog.Default()
	t.Cleanup(func() { slog.SetDefault(old) })
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})))
	Failed("Thing.Release", nil, "handle", "0x1")
	assert.Empty(t, buf.String(), "no error, no record")
	Failed("Thing.Release", errors.New("boom"), "handle", "0x1")
	assert.Equal(t, `level=WARN msg="cudamem: background release failed" op=Thing.Release handle=0x1 err=boom`+"\n",
		stripTime(buf.String()))
}

func stripTime(s string) string {
	if i := bytes.IndexByte([]byte(s), ' '); i >= 0 && len(s) > 5 && s[:5] == "time=" {
		return s[i+1:]
	}
	return s
}
