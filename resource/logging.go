package resource

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// LoggingOptions configures NewLogging. A nil *LoggingOptions means the
// zero value.
type LoggingOptions struct {
	// Name is added to every record as the "resource" attribute, to tell
	// several logged resources apart in one log; "" leaves it out.
	Name string
	// Level is the level of the records; nil means slog.LevelDebug. A
	// *slog.LevelVar may be given to change it while the program runs.
	Level slog.Leveler
}

// Logging writes a log/slog record for every allocation and free that
// goes through it, as RMM's logging_resource_adaptor writes its CSV:
//
//	msg=allocate resource=NAME size=1048576 addr=0x7f3a40000000 stream=0x55d0c1a2b3c0 device=0 duration=1.2µs
//	msg=deallocate resource=NAME size=1048576 addr=0x7f3a40000000 stream=0x55d0c1a2b3c0 device=0 duration=800ns
//
// A failed call adds an "err" attribute (and has addr 0 for Allocate).
// stream is the CUstream handle the upstream used (0 for the legacy
// default stream), device the upstream's DeviceID, duration how long the
// upstream call took.
//
// The records are at Debug (LoggingOptions.Level). When the handler does
// not take that level, a call costs one Enabled check more than the
// upstream's (no clock reading, no attributes, no allocation), so the
// adaptor can stay in a production stack and be turned on with a
// *slog.LevelVar when needed.
//
// A deallocate record is written after the upstream call returns (it
// carries the duration), so an address freed and allocated again on
// other goroutines may show its new allocate record before the old
// deallocate record (RMM logs frees before freeing): order by time minus
// duration when replaying such logs.
//
// The handler runs on the goroutine of each call, after the upstream
// call, with no lock of the Logging held: it may block and may use the
// Logging. If it panics, the panic goes on to the caller; an allocation
// it was recording is first given back to the upstream, a free is done.
//
// Buffers from Allocate are owned by the Logging, so that their Close is
// logged. Logging is safe for concurrent use (slog handlers are).
type Logging struct {
	up     buffer.MemoryResource
	logger *slog.Logger // nil: slog.Default() at each call
	lvar   slog.Leveler // a level that may change (a *slog.LevelVar); nil: lvl
	lvl    slog.Level
	name   string
}

var _ buffer.MemoryResource = (*Logging)(nil)

// NewLogging returns a resource that allocates from upstream and logs each
// allocation and free to logger (nil: slog.Default() at each call, so a
// later slog.SetDefault takes effect). opts may be nil. A nil upstream
// makes every Allocate fail with an error matching cuda.ErrInvalidArgument.
func NewLogging(upstream buffer.MemoryResource, logger *slog.Logger, opts *LoggingOptions) *Logging {
	r := &Logging{up: adaptorUpstream(upstream), logger: logger, lvl: slog.LevelDebug}
	if opts != nil {
		r.name = opts.Name
		switch l := opts.Level.(type) {
		case nil:
		case slog.Level:
			r.lvl = l
		default:
			if !holdsNil(l) { // a nil *slog.LevelVar: the default level, not a panic at each call
				r.lvar = l
			}
		}
	}
	return r
}

// level is the level of the records.
func (r *Logging) level() slog.Level {
	if r.lvar != nil {
		return r.lvar.Level()
	}
	return r.lvl
}

// enabled returns the logger and whether it takes records at the level: the
// only work a call does beyond the upstream's when logging is off.
func (r *Logging) enabled() (*slog.Logger, bool) {
	l := r.logger
	if l == nil || l.Handler() == nil {
		l = slog.Default() // nil, or a zero slog.Logger, whose use panics
	}
	return l, l.Handler().Enabled(context.Background(), r.level())
}

// Allocate allocates from the upstream and logs the allocation, or the
// failure. Upstream errors are returned unchanged.
func (r *Logging) Allocate(size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	return buffer.Allocate(r, size, s)
}

// AllocatePtr is Allocate without the Buffer ([buffer.MemoryResource]): the
// address (0 for size 0) and the stream the upstream ordered it on,
// logged. Free it with Deallocate.
func (r *Logging) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if r == nil || r.up == nil {
		return 0, nil, errNoUpstream("Logging", "Allocate")
	}
	l, on := r.enabled()
	if !on {
		return r.up.AllocatePtr(size, s)
	}
	start := time.Now()
	ptr, us, err := r.up.AllocatePtr(size, s)
	d := time.Since(start)
	if err == nil {
		s = us // the stream the upstream chose for nil
	}
	// The handler is user code: if it panics, the memory it was logging
	// would reach no caller. It goes back to the upstream, and the panic
	// goes on.
	logged := false
	defer func() {
		if !logged && err == nil && ptr != 0 {
			_ = r.up.Deallocate(ptr, size, us)
		}
	}()
	r.log(l, "allocate", size, ptr, s, d, err)
	logged = true
	return ptr, us, err
}

// Deallocate frees through the upstream and logs the free, or the failure.
// A zero ptr does nothing and is not logged (Buffer.Close never frees an
// empty buffer).
func (r *Logging) Deallocate(ptr cuda.DevicePtr, size uint64, s *cuda.Stream) error {
	if ptr == 0 {
		return nil
	}
	if r == nil || r.up == nil {
		return errNoUpstream("Logging", "Deallocate")
	}
	l, on := r.enabled()
	if !on {
		return r.up.Deallocate(ptr, size, s)
	}
	start := time.Now()
	err := r.up.Deallocate(ptr, size, s)
	r.log(l, "deallocate", size, ptr, s, time.Since(start), err)
	return err
}

// log writes one record. Only called when the level is enabled.
func (r *Logging) log(l *slog.Logger, msg string, size uint64, ptr cuda.DevicePtr, s *cuda.Stream, d time.Duration, err error) {
	attrs := make([]slog.Attr, 0, 7)
	if r.name != "" {
		attrs = append(attrs, slog.String("resource", r.name))
	}
	attrs = append(attrs,
		slog.Uint64("size", size),
		slog.String("addr", hex(uint64(ptr))),
		slog.String("stream", hex(uint64(s.Handle()))),
		slog.Int("device", r.up.DeviceID()),
		slog.Duration("duration", d),
	)
	if err != nil {
		attrs = append(attrs, slog.String("err", err.Error()))
	}
	l.LogAttrs(context.Background(), r.level(), msg, attrs...)
}

func hex(v uint64) string { return "0x" + strconv.FormatUint(v, 16) }

// Upstream is the resource r allocates from (nil if none).
func (r *Logging) Upstream() buffer.MemoryResource {
	if r == nil {
		return nil
	}
	return r.up
}

// DeviceAccessible, HostAccessible and DeviceID answer for the upstream.
func (r *Logging) DeviceAccessible() bool { return upDeviceAccessible(r.Upstream()) }
func (r *Logging) HostAccessible() bool   { return upHostAccessible(r.Upstream()) }
func (r *Logging) DeviceID() int          { return upDeviceID(r.Upstream()) }

// String describes the resource for logs.
func (r *Logging) String() string {
	if r == nil {
		return "Logging(nil)"
	}
	detail := ""
	if r.name != "" {
		detail = fmt.Sprintf("%q", r.name)
	}
	return adaptorString("Logging", r.up, detail)
}
