package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
)

// Alternation: the C baseline program runs beside bench with -serve, and
// each repetition of one of our measurements is paired with one of its
// baseline's, run right before or after it (the order swaps every
// repetition). The driver's state drifts within a run and between leases
// (a pool pair's time moved 1.8x between two leases with tight spreads in
// each); paired runs share it, so their ratio shows the difference apart
// from the drift.

// baselineServer is the C baseline program running with -serve.
type baselineServer struct {
	path string
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	tail *tailBuffer
}

// startBaseline starts the baseline program serving names and waits for
// its setup to finish (its first, empty line).
func startBaseline(f *benchFlags, names []string, stderr io.Writer) (*baselineServer, error) {
	path, err := baselinePath(f)
	if err != nil {
		return nil, err
	}
	b := &baselineServer{path: path, tail: &tailBuffer{}}
	b.cmd = exec.Command(path, append(baselineArgs(f, names), "-serve")...)
	b.cmd.Stderr = io.MultiWriter(stderr, b.tail)
	if b.in, err = b.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	out, err := b.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	b.out = bufio.NewReader(out)
	if err := b.cmd.Start(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	line, err := b.out.ReadString('\n')
	if err != nil || line != "\n" {
		return nil, b.failed(fmt.Errorf("no -serve ready line (printed %q): %w", line, cmpErr(err)))
	}
	return b, nil
}

func cmpErr(err error) error {
	if err == nil {
		return errors.New("unexpected output")
	}
	return err
}

// failed ends the program and returns err with what it said on stderr.
func (b *baselineServer) failed(err error) error {
	b.in.Close()
	werr := b.cmd.Wait()
	msg := strings.TrimSpace(b.tail.String())
	if werr != nil {
		err = fmt.Errorf("%w (%v)", err, werr)
	}
	if msg != "" {
		return fmt.Errorf("%s: %w: %s", b.path, err, msg)
	}
	return fmt.Errorf("%s: %w", b.path, err)
}

// run has the program run one repetition of name and returns its lines
// (name's, then its side figure's). An error means the program cannot
// serve any more (it was ended); a line with Error set is a figure it
// could not make, and it serves on.
func (b *baselineServer) run(name string) ([]result, error) {
	if _, err := io.WriteString(b.in, name+"\n"); err != nil {
		return nil, b.failed(fmt.Errorf("asking for %s: %w", name, err))
	}
	var rs []result
	for {
		line, err := b.out.ReadString('\n')
		if err != nil {
			return rs, b.failed(fmt.Errorf("reading %s: %w", name, err))
		}
		if line == "\n" {
			return rs, nil
		}
		var r result
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return rs, b.failed(fmt.Errorf("printed %q: %w", strings.TrimSpace(line), err))
		}
		rs = append(rs, r)
	}
}

// close ends the serving (end of its stdin) and waits for the program.
func (b *baselineServer) close() error {
	if err := b.in.Close(); err != nil {
		return err
	}
	if err := b.cmd.Wait(); err != nil {
		if msg := strings.TrimSpace(b.tail.String()); msg != "" {
			return fmt.Errorf("%s: %w: %s", b.path, err, msg)
		}
		return fmt.Errorf("%s: %w", b.path, err)
	}
	return nil
}

// pairer runs the baseline repetitions paired with ours. Once the program
// failed, it pairs no more (err says why).
type pairer struct {
	srv    *baselineServer
	base   []result // every baseline figure, numbered per name
	logged int      // how many of base -log has
	reps   map[string]int
	err    error
}

// once runs name's baseline once and returns its figures by name; nil
// when there is none (no baseline, the program failed, or it could not
// measure it).
func (p *pairer) once(name string) map[string]result {
	if p == nil || p.srv == nil || name == "" {
		return nil
	}
	rs, err := p.srv.run(name)
	if err != nil {
		p.err, p.srv = err, nil
	}
	got := map[string]result{}
	for _, r := range rs {
		if r.Error != "" {
			continue // the program's skip or refusal: no figure
		}
		p.reps[r.Name]++
		r.Rep = p.reps[r.Name]
		p.base = append(p.base, r)
		got[r.Name] = r
	}
	return got
}

// pairRatio is ours ÷ the paired baseline figure (time per operation), or
// 0 when there is none.
func pairRatio(ours result, base map[string]result, name string) float64 {
	b, ok := base[name]
	if !ok || !(b.NsPerOp > 0) || !(ours.NsPerOp > 0) {
		return 0
	}
	return ours.NsPerOp / b.NsPerOp
}
