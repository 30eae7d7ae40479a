package warn

import (
	"context"
	"log/slog"
)

// Msg is the message of every record.
const Msg = "cudamem: background release failed"

// Failed logs that background operation op failed with err (nil logs
// nothing); args are slog key-value pairs (or slog.Attrs) naming what was
// being released: the handle, the address and size, the fd.
func Failed(op string, err error, args ...any) {
	if err == nil {
		return
	}
	l := slog.Default()
	ctx := context.Background()
	if !l.Enabled(ctx, slog.LevelWarn) {
		return
	}
	l.Log(ctx, slog.LevelWarn, Msg, append(append([]any{"op", op}, args...), "err", err)...)
}
