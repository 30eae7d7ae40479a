//go:build cudamemfault

package faultsweep

import (
	"errors"

	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
)

// TestFaultSweepGraph: the capture pipeline — BeginCapture, a graph
// allocation, a fill, the free node, EndCapture, Instantiate, Launch,
// and closing exec and graph — with each driver call failing in turn.
// Whatever fails, the error names it, the capture is ended, and every
// graph, exec and graph allocation is gone afterwards.
func TestFaultSweepGraph(t *testing.T) {
	sweepAll(t, []sweepCase{{
		name: "graph pipeline",
		absorbed: map[string]string{
			"cuStreamIsCapturing": "a failed confirmation of a capturing stream is taken as still capturing (the safe side)",
		},
		setup: func() (*fixture, error) {
			var cl closers
			s, err := newStream(&cl, 0)
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			gm, err := resource.NewGraphMemory(s.Device())
			if err != nil {
				return nil, joinSetup(err, cl)
			}
			run := func() (err error) {
				var g *cuda.Graph
				var e *cuda.GraphExec
				var tmp *buffer.Buffer
				defer func() {
					// Undo whatever the failure left (these calls are not
					// failed: only one call per run is).
					if s.IsCapturing() {
						if g2, eerr := s.EndCapture(); eerr == nil {
							err = errors.Join(err, g2.Close())
						}
					}
					if tmp != nil && !tmp.IsClosed() {
						_, _, _ = tmp.Disown() // its graph is gone with it
					}
					err = errors.Join(err, e.Close(), g.Close())
				}()
				if err := s.BeginCapture(); err != nil {
					return err
				}
				if tmp, err = gm.Allocate(4096, s); err != nil {
					return err
				}
				if err := tmp.Fill32(1, s); err != nil {
					return err
				}
				if err := tmp.Close(); err != nil {
					return err
				}
				if g, err = s.EndCapture(); err != nil {
					return err
				}
				if e, err = g.Instantiate(0); err != nil {
					return err
				}
				if err := e.Launch(s); err != nil {
					return err
				}
				if err := e.Close(); err != nil {
					return err
				}
				return g.Close()
			}
			return &fixture{
				op:      run,
				verify:  run,
				cleanup: func() error { return joinClose(gm.Trim(), cl) },
			}, nil
		},
	}})
}

// TestFaultSweepCloseCapturing: Stream.Close of a stream that is capturing
// (it ends the capture, discards the graph, then destroys the stream),
// with each driver call failing in turn. Whatever fails, the error names
// it and the stream is either closed with nothing left, or still open and
// still capturing so that a second Close finishes the job.
func TestFaultSweepCloseCapturing(t *testing.T) {
	sweepAll(t, []sweepCase{{
		name: "close a capturing stream",
		absorbed: map[string]string{
			"cuStreamIsCapturing": "a failed query after the capture ended is taken as still capturing, and the retry ends it",
		},
		setup: func() (*fixture, error) {
			d, err := cuda.GetDevice(0)
			if err != nil {
				return nil, err
			}
			run := func() (err error) {
				s, err := d.NewStream()
				if err != nil {
					return err
				}
				defer func() {
					// A failed Close leaves the stream open: a second Close
					// (no failure injected now) must finish it.
					if !s.IsClosed() {
						err = errors.Join(err, s.Close())
					}
				}()
				if err := s.BeginCapture(); err != nil {
					return err
				}
				if err := s.MemsetD8Async(0, 0, 0); err != nil {
					return err
				}
				return s.Close()
			}
			return &fixture{op: run, verify: run, cleanup: func() error { return nil }}, nil
		},
	}})
}
