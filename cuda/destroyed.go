package cuda

import (
	"fmt"
	"sync"
)

// The record of handles cudamem destroyed. The driver does not validate a
// destroyed object's handle and may crash on it, so the entry points that
// take a raw handle (WrapContext, WrapGreenContext, Device.WrapStream)
// refuse one cudamem destroyed without calling the driver. A handle
// destroyed by someone else reaches the driver. An address cudamem
// creates an object at again (or the driver hands back as live) leaves
// the record, but one another library reuses is refused, since nothing
// safe tells the two apart. That is why streams closed on their own are
// not recorded (they come and go far more often, and other libraries'
// new streams would be refused); only those that die with a context
// cudamem destroys are.

// handleKind is the kind of driver object a recorded handle names.
type handleKind uint8

const (
	kindContext handleKind = iota // CUcontext
	kindGreen                     // CUgreenCtx
	kindStream                    // CUstream
)

func (k handleKind) String() string {
	switch k {
	case kindContext:
		return "context"
	case kindGreen:
		return "green context"
	}
	return "stream"
}

// result is the driver's answer the docs promise for a stale handle of
// kind k, kept in the refusal's chain so callers that matched the
// driver's error still match it.
func (k handleKind) result() Result {
	if k == kindContext {
		return ErrorInvalidContext
	}
	return ErrorInvalidHandle
}

type handleKey struct {
	kind handleKind
	h    uintptr
}

// goneMax bounds the record. A handle past it is forgotten (one chosen at
// random), so a program that destroys more objects than that and hands an
// old handle back is not protected; addresses the driver reuses for
// cudamem's new objects leave the record, so it rarely fills.
const goneMax = 1 << 14

var gone = struct {
	mu sync.Mutex
	m  map[handleKey]string // what destroyed it (the operation's name)
	// streams are the live streams cudamem created, by handle, so that
	// Context.Close records those that die with their context.
	streams map[uintptr]*Device
}{streams: map[uintptr]*Device{}}

// noteDestroyedLocked records that cudamem destroyed handle h of kind k,
// in the operation named by. The caller holds gone.mu.
func noteDestroyedLocked(k handleKind, h uintptr, by string) {
	if h == 0 {
		return
	}
	if gone.m == nil {
		gone.m = make(map[handleKey]string)
	}
	if len(gone.m) >= goneMax {
		for key := range gone.m {
			delete(gone.m, key)
			break
		}
	}
	gone.m[handleKey{k, h}] = by
}

// noteLive records that handle h of kind k names a live object now (the
// driver just created it, or handed it out as live): a destroyed object's
// address reused.
func noteLive(k handleKind, h uintptr) {
	gone.mu.Lock()
	defer gone.mu.Unlock()
	delete(gone.m, handleKey{k, h})
}

// refuseDestroyed is the error for an operation op given handle h of kind
// k that cudamem destroyed, nil for any other handle. It matches
// ErrInvalidArgument and the Result the driver gives for a stale handle
// of that kind (CUDA_ERROR_INVALID_CONTEXT, CUDA_ERROR_INVALID_HANDLE).
func refuseDestroyed(op string, k handleKind, h uintptr) error {
	gone.mu.Lock()
	by, dead := gone.m[handleKey{k, h}]
	gone.mu.Unlock()
	if !dead {
		return nil
	}
	return &OpError{Op: op, Err: fmt.Errorf("%w: %v %#x was destroyed (%s); a destroyed handle is not handed to the driver, which may crash on it (%w)",
		ErrInvalidArgument, k, h, by, k.result())}
}

// streamCreated records s, a stream cudamem just created, as live: its
// handle may be a destroyed stream's address reused, and Context.Close
// records it as destroyed if it dies with its context.
func streamCreated(s *Stream) {
	if s == nil || s.handle == 0 {
		return
	}
	gone.mu.Lock()
	defer gone.mu.Unlock()
	delete(gone.m, handleKey{kindStream, s.handle})
	gone.streams[s.handle] = s.dev
}

// streamClosed forgets s, which Stream.Close destroyed, without recording
// its handle (see the record's comment above).
func streamClosed(s *Stream) {
	if s == nil || s.handle == 0 {
		return
	}
	gone.mu.Lock()
	defer gone.mu.Unlock()
	if gone.streams[s.handle] == s.dev {
		delete(gone.streams, s.handle)
	}
}

// contextDestroyed records that Context.Close (op) destroyed view v's
// context: its handle, its green context's, and the streams cudamem made
// in it, which cuCtxDestroy destroys with it. A green context's streams
// are not destroyed (CUDA leaks them and refuses calls on them), so they
// are only forgotten.
func contextDestroyed(v *Device, green uintptr, op string) {
	gone.mu.Lock()
	defer gone.mu.Unlock()
	noteDestroyedLocked(kindContext, v.ctx, op)
	if green != 0 {
		noteDestroyedLocked(kindGreen, green, op)
	}
	for h, d := range gone.streams {
		if d != v {
			continue
		}
		delete(gone.streams, h)
		if green == 0 {
			noteDestroyedLocked(kindStream, h, op+" (with its context)")
		}
	}
}
