//go:build cudamemfault

package faultsweep

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// closers runs cleanups in reverse order, joining their errors.
type closers []func() error

func (c *closers) add(f func() error) { *c = append(*c, f) }

func (c closers) run() error {
	var errs []error
	for i := len(c) - 1; i >= 0; i-- {
		errs = append(errs, c[i]())
	}
	return errors.Join(errs...)
}

func device(i int) (*cuda.Device, error) { return cuda.GetDevice(i) }

// newStream makes a stream on device i and registers its Close.
func newStream(cl *closers, i int) (*cuda.Stream, error) {
	d, err := device(i)
	if err != nil {
		return nil, err
	}
	s, err := d.NewStream()
	if err != nil {
		return nil, err
	}
	cl.add(s.Close)
	return s, nil
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>9)
	}
	return b
}

// write fills b with pattern(seed) through a host copy.
func write(b *buffer.Buffer, s *cuda.Stream, seed byte) error {
	if err := buffer.CopyFromHost(b, pattern(int(b.Size()), seed), s); err != nil {
		return err
	}
	return syncStream(s)
}

// check reads b back and compares it with want.
func check(b *buffer.Buffer, s *cuda.Stream, want []byte) error {
	got := make([]byte, b.Size())
	if err := buffer.CopyToHost(got, b, s); err != nil {
		return err
	}
	if err := syncStream(s); err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && got[i] == want[i] {
			i++
		}
		return fmt.Errorf("data differs at byte %d of %d", i, len(got))
	}
	return nil
}

// roundTrip writes a pattern into b and reads it back.
func roundTrip(b *buffer.Buffer, s *cuda.Stream, seed byte) error {
	if err := write(b, s, seed); err != nil {
		return err
	}
	return check(b, s, pattern(int(b.Size()), seed))
}

func syncStream(s *cuda.Stream) error {
	if s == nil {
		return nil
	}
	return s.Sync()
}

// usable allocates from mr, round-trips data and frees: the resource works.
func usable(mr buffer.MemoryResource, size uint64, s *cuda.Stream) error {
	b, err := buffer.Allocate(mr, size, s)
	if err != nil {
		return fmt.Errorf("resource unusable: %w", err)
	}
	return errors.Join(roundTrip(b, s, 0x5a), b.Close())
}

// closeBuf closes b if it is non-nil.
func closeBuf(b **buffer.Buffer) func() error {
	return func() error {
		if *b == nil {
			return nil
		}
		return (*b).Close()
	}
}

func poolState(attrs func() (resource.PoolAttributes, error)) func() string {
	return func() string {
		a, err := attrs()
		if err != nil {
			return "attributes: " + err.Error()
		}
		return fmt.Sprintf("pool used %d", a.UsedMemCurrent)
	}
}
