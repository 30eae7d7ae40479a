package buffer_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
)

// fuzzView is the model of one buffer in FuzzBufferOps: where it starts
// in the owner, its size, and the view it was sliced from.
type fuzzView struct {
	b      *buffer.Buffer
	off, n uint64
	parent int // index of the view it was sliced from; -1 for the owner
	closed bool
}

// FuzzBufferOps runs a sequence of Slice, ReadAt, WriteAt, Bytes and
// Close calls, decoded from ops, on a host buffer of size bytes and the
// views sliced from it, against a model: every call must succeed or fail
// exactly as the model says (bounds refused with ErrInvalidArgument, EOF
// at the end, ErrClosed after Close), and the bytes read must be the
// bytes written. Host memory behind a resource that says no device can
// reach it is copied on the CPU, so no driver is needed.
func FuzzBufferOps(f *testing.F) {
	op := func(kind byte, view byte, off, n uint64) []byte {
		b := []byte{kind, view}
		b = binary.LittleEndian.AppendUint64(b, off)
		return binary.LittleEndian.AppendUint64(b, n)
	}
	cat := func(ops ...[]byte) []byte { return bytes.Join(ops, nil) }
	f.Add(uint16(64), cat(op(2, 0, 3, 10), op(1, 0, 0, 64), op(0, 0, 2, 20), op(1, 1, 0, 20)))
	f.Add(uint16(16), cat(op(0, 0, 16, 0), op(2, 1, 0, 1), op(1, 1, 0, 1)))
	f.Add(uint16(100), cat(op(0, 0, 1<<63, 1<<63), op(1, 0, 1<<63, 8), op(2, 0, 1<<63-1, 2)))
	f.Add(uint16(32), cat(op(0, 0, 8, 16), op(0, 1, 4, 8), op(4, 1, 0, 0), op(1, 2, 0, 4), op(2, 0, 8, 16), op(3, 0, 0, 0)))
	f.Add(uint16(8), cat(op(4, 0, 0, 0), op(1, 0, 0, 1), op(0, 0, 0, 1)))
	f.Fuzz(func(t *testing.T, size uint16, ops []byte) {
		mr := newHeap()
		owner, err := buffer.Allocate(mr, uint64(size), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer owner.Close()
		shadow := make([]byte, size)
		views := []fuzzView{{b: owner, n: uint64(size), parent: -1}}
		// closed reports whether view i, or one it was sliced from, is closed.
		closed := func(i int) bool {
			for ; i >= 0; i = views[i].parent {
				if views[i].closed {
					return true
				}
			}
			return false
		}
		expect := func(what string, err, want error) {
			t.Helper()
			if want == nil && err != nil || want != nil && !errors.Is(err, want) {
				t.Fatalf("%s: got error %v, want %v", what, err, want)
			}
		}
		for step := 0; len(ops) >= 18 && step < 64; step++ {
			kind, vi := ops[0]%5, int(ops[1])%len(views)
			off, n := binary.LittleEndian.Uint64(ops[2:]), binary.LittleEndian.Uint64(ops[10:])
			ops = ops[18:]
			v := &views[vi]
			dead := closed(vi)
			switch kind {
			case 0: // Slice
				w, err := v.b.Slice(off, n)
				switch {
				case dead:
					expect("Slice of a closed view", err, cuda.ErrClosed)
				case off > v.n || n > v.n-off:
					expect("Slice out of bounds", err, cuda.ErrInvalidArgument)
				default:
					expect("Slice", err, nil)
					if w.Size() != n || w.Ptr() != owner.Ptr()+cuda.DevicePtr(v.off+off) {
						t.Fatalf("Slice(%d, %d) of view %d: size %d at %#x", off, n, vi, w.Size(), w.Ptr())
					}
					if len(views) < 32 {
						views = append(views, fuzzView{b: w, off: v.off + off, n: n, parent: vi})
					}
				}
			case 1: // ReadAt
				p := make([]byte, n%4096)
				got, err := v.b.ReadAt(p, int64(off))
				switch {
				case dead:
					expect("ReadAt on a closed view", err, cuda.ErrClosed)
				case int64(off) < 0:
					expect("ReadAt at a negative offset", err, cuda.ErrInvalidArgument)
				case off >= v.n:
					if got != 0 || err != io.EOF {
						t.Fatalf("ReadAt at %d of %d bytes: %d, %v; want 0, EOF", off, v.n, got, err)
					}
				default:
					want := min(uint64(len(p)), v.n-off)
					if uint64(got) != want || (want < uint64(len(p))) != (err == io.EOF) || err != nil && err != io.EOF {
						t.Fatalf("ReadAt(%d bytes at %d) of %d bytes: %d, %v", len(p), off, v.n, got, err)
					}
					if !bytes.Equal(p[:got], shadow[v.off+off:v.off+off+want]) {
						t.Fatalf("ReadAt(%d bytes at %d): other bytes than written", len(p), off)
					}
				}
			case 2: // WriteAt
				p := bytes.Repeat([]byte{byte(step + 1)}, int(n%4096))
				got, err := v.b.WriteAt(p, int64(off))
				switch {
				case dead:
					expect("WriteAt on a closed view", err, cuda.ErrClosed)
				case int64(off) < 0 || off > v.n || uint64(len(p)) > v.n-off:
					expect("WriteAt out of bounds", err, cuda.ErrInvalidArgument)
					if got != 0 {
						t.Fatalf("WriteAt out of bounds wrote %d bytes", got)
					}
				default:
					expect("WriteAt", err, nil)
					if got != len(p) {
						t.Fatalf("WriteAt wrote %d of %d bytes", got, len(p))
					}
					copy(shadow[v.off+off:], p)
				}
			case 3: // Bytes
				p, err := v.b.Bytes()
				if dead {
					expect("Bytes of a closed view", err, cuda.ErrClosed)
					break
				}
				expect("Bytes", err, nil)
				if !bytes.Equal(p, shadow[v.off:v.off+v.n]) {
					t.Fatalf("Bytes of view %d: other bytes than written", vi)
				}
			case 4: // Close (never the owner: it would end the run)
				if vi == 0 {
					break
				}
				expect("Close", v.b.Close(), nil)
				v.closed = true
				if !v.b.IsClosed() {
					t.Fatal("a closed view is not closed")
				}
			}
		}
		p, err := owner.Bytes()
		if err != nil || !bytes.Equal(p, shadow) {
			t.Fatalf("the owner's bytes differ from the model (%v)", err)
		}
	})
}
