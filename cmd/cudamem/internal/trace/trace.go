// Package trace reads, writes and generates allocation traces: text
// lines "a ID SIZE" (allocate SIZE bytes under ID) and "f ID" (free the
// allocation ID), the format other allocators' replay scripts use, so
// that one trace can be replayed on each of them and the results set side
// by side.
//
// A trace comes from anywhere, so the reader trusts nothing in it: every
// line is checked (its form, a size within the limit, an ID allocated
// twice while live, a free of an ID that is not live) and a bad line is
// an error naming its number and text. Memory use is bounded by the
// line length and the number of live allocations, both limited.
package trace

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Op is one line of a trace: an allocation of Size bytes under ID, or
// (Free set) the free of the allocation ID, whose Size is 0.
type Op struct {
	Free bool
	ID   uint64
	Size uint64
}

// ErrBadTrace is what every error about a trace's content matches.
var ErrBadTrace = errors.New("bad trace")

// Limits bound what a Reader accepts.
type Limits struct {
	// MaxSize is the largest allocation accepted, in bytes (0: no limit
	// but the 64-bit range).
	MaxSize uint64
	// MaxLive is the most allocations live at once (0: DefaultMaxLive).
	MaxLive int
}

const (
	// DefaultMaxLive is Limits.MaxLive's default.
	DefaultMaxLive = 1 << 22
	// MaxLine is the longest line accepted, in bytes.
	MaxLine = 256
)

// Reader reads a trace one operation at a time, checking each.
type Reader struct {
	sc   *bufio.Scanner
	lim  Limits
	line int
	live map[uint64]uint64 // ID -> size
	err  error             // sticky, once Next failed
}

// NewReader returns a Reader of r with the limits lim.
func NewReader(r io.Reader, lim Limits) *Reader {
	if lim.MaxLive <= 0 {
		lim.MaxLive = DefaultMaxLive
	}
	if lim.MaxSize == 0 {
		lim.MaxSize = ^uint64(0)
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, MaxLine+1), MaxLine+1) // +1: the newline
	return &Reader{sc: sc, lim: lim, live: map[uint64]uint64{}}
}

// Line is the number of the line Next read last (1-based).
func (r *Reader) Line() int { return r.line }

// Live is the number of allocations live after the lines read so far.
func (r *Reader) Live() int { return len(r.live) }

// LiveIDs returns the IDs live after the lines read so far, in no order.
func (r *Reader) LiveIDs() []uint64 {
	ids := make([]uint64, 0, len(r.live))
	for id := range r.live {
		ids = append(ids, id)
	}
	return ids
}

// Next returns the next operation, io.EOF after the last. Blank lines
// and lines starting with '#' are skipped. A bad line is an error
// matching ErrBadTrace that names the line; it ends the reading (later
// calls return the same error).
func (r *Reader) Next() (Op, error) {
	if r.err != nil {
		return Op{}, r.err
	}
	op, err := r.next()
	if err != nil {
		r.err = err
	}
	return op, err
}

func (r *Reader) next() (Op, error) {
	for r.sc.Scan() {
		r.line++
		text := r.sc.Text()
		t := strings.TrimSpace(text)
		if t == "" || t[0] == '#' {
			continue
		}
		op, err := r.parse(t)
		if err != nil {
			return Op{}, fmt.Errorf("%w: line %d: %q: %s", ErrBadTrace, r.line, text, err)
		}
		return op, nil
	}
	switch err := r.sc.Err(); {
	case errors.Is(err, bufio.ErrTooLong):
		return Op{}, fmt.Errorf("%w: line %d: longer than %d bytes", ErrBadTrace, r.line+1, MaxLine)
	case err != nil:
		return Op{}, fmt.Errorf("reading the trace after line %d: %w", r.line, err)
	}
	return Op{}, io.EOF
}

// parse checks one line (trimmed, not blank) and applies it to the live set.
func (r *Reader) parse(t string) (Op, error) {
	f := strings.Fields(t)
	switch f[0] {
	case "a":
		if len(f) != 3 {
			return Op{}, errors.New(`want "a ID SIZE"`)
		}
		id, err := number(f[1], "ID")
		if err != nil {
			return Op{}, err
		}
		size, err := number(f[2], "SIZE")
		if err != nil {
			return Op{}, err
		}
		switch {
		case size == 0:
			return Op{}, errors.New("size 0 (want at least 1 byte)")
		case size > r.lim.MaxSize:
			return Op{}, fmt.Errorf("size %d exceeds the limit of %d bytes", size, r.lim.MaxSize)
		}
		if _, ok := r.live[id]; ok {
			return Op{}, fmt.Errorf("ID %d is already live (allocated again before its free)", id)
		}
		if len(r.live) >= r.lim.MaxLive {
			return Op{}, fmt.Errorf("more than %d allocations live at once", r.lim.MaxLive)
		}
		r.live[id] = size
		return Op{ID: id, Size: size}, nil
	case "f":
		if len(f) != 2 && !(len(f) == 3 && f[2] == "0") {
			return Op{}, errors.New(`want "f ID" (or "f ID 0")`)
		}
		id, err := number(f[1], "ID")
		if err != nil {
			return Op{}, err
		}
		if _, ok := r.live[id]; !ok {
			return Op{}, fmt.Errorf("free of ID %d, which is not live (never allocated, or freed already)", id)
		}
		delete(r.live, id)
		return Op{Free: true, ID: id}, nil
	}
	return Op{}, fmt.Errorf(`unknown operation %q (want "a" or "f")`, f[0])
}

// number parses a decimal unsigned 64-bit field.
func number(s, what string) (uint64, error) {
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s %q is not a decimal number of 64 bits", what, s)
	}
	return n, nil
}

// Parse reads a whole trace with the limits lim.
func Parse(r io.Reader, lim Limits) ([]Op, error) {
	tr := NewReader(r, lim)
	var ops []Op
	for {
		op, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return ops, nil
		}
		if err != nil {
			return nil, err
		}
		ops = append(ops, op)
	}
}

// Write writes ops as trace lines ("f ID" for frees).
func Write(w io.Writer, ops []Op) error {
	bw := bufio.NewWriter(w)
	var b []byte
	for _, op := range ops {
		b = b[:0]
		if op.Free {
			b = append(b, "f "...)
			b = strconv.AppendUint(b, op.ID, 10)
		} else {
			b = append(b, "a "...)
			b = strconv.AppendUint(b, op.ID, 10)
			b = append(b, ' ')
			b = strconv.AppendUint(b, op.Size, 10)
		}
		b = append(b, '\n')
		if _, err := bw.Write(b); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// Summary is what a trace comes to.
type Summary struct {
	Allocations, Frees int
	// PeakLive is the most bytes live at once; LiveAtEnd the bytes live
	// after the last line (0 for a trace that frees everything).
	PeakLive, LiveAtEnd uint64
	// PeakCount is the most allocations live at once.
	PeakCount int
}

// Summarize adds ops up. ops must be a checked trace (from Parse or
// Generate): a free of an ID not live counts 0 bytes.
func Summarize(ops []Op) Summary {
	var s Summary
	live := map[uint64]uint64{}
	for _, op := range ops {
		if op.Free {
			s.Frees++
			s.LiveAtEnd -= live[op.ID]
			delete(live, op.ID)
			continue
		}
		s.Allocations++
		live[op.ID] = op.Size
		s.LiveAtEnd += op.Size
		s.PeakLive = max(s.PeakLive, s.LiveAtEnd)
		s.PeakCount = max(s.PeakCount, len(live))
	}
	return s
}
