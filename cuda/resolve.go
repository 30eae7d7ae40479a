package cuda

import "fmt"

// errZeroStream is the one error for a Stream no device made (nil or the
// zero value), wherever a stream is checked.
func errZeroStream(op string) error {
	return Errorf(op, ErrInvalidArgument, "nil or zero stream (a cuda.Stream no device made: use Device.NewStream, Device.DefaultStream, or nil where the legacy default stream is meant)")
}

// ResolveStream resolves the stream argument of operation op on memory of
// device d, the one place every package checks a stream, without a driver
// call. nil means d's legacy default stream; a zero Stream and a closed
// one (matching ErrClosed) are errors naming op, and so, with sameGPU, is
// a stream of another GPU than d's (any context of d's GPU is accepted).
// d may be nil for memory bound to no device when s is not nil.
func (d *Device) ResolveStream(op string, s *Stream, sameGPU bool) (*Stream, error) {
	if s == nil {
		if d == nil {
			return nil, Errorf(op, ErrInvalidArgument, "nil stream, and no device whose legacy default stream it would mean")
		}
		return d.DefaultStream(), nil
	}
	sd := s.Device()
	switch {
	case sd == nil:
		return nil, errZeroStream(op)
	case s.IsClosed():
		return nil, &OpError{Op: op, Err: fmt.Errorf("%w: stream of %v", ErrClosed, sd)}
	case sameGPU && d != nil && !sd.SameGPU(d):
		return nil, Errorf(op, ErrInvalidArgument, "stream of %v given for memory of %v (use a stream of that device)", sd, d)
	}
	return s, nil
}
