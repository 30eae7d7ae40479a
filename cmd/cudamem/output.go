package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// outFile is an output file named on the command line. It is opened
// before the work that fills it, so a name that cannot be written fails
// at once rather than after a long run; what was there stays until
// write replaces it.
type outFile struct {
	name    string
	f       *os.File // nil for "-" (standard output) and once written
	created bool     // made by open: discard removes it
	stdout  io.Writer
}

// openOut opens name for writing without truncating it; "-" is stdout.
func openOut(name string, stdout io.Writer) (*outFile, error) {
	o := &outFile{name: name, stdout: stdout}
	if name == "-" {
		return o, nil
	}
	_, statErr := os.Stat(name)
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE, 0o666)
	if err != nil {
		return nil, err // *fs.PathError: names the file
	}
	o.f, o.created = f, errors.Is(statErr, fs.ErrNotExist)
	return o, nil
}

// write replaces the file's contents with what fill writes, and closes it.
func (o *outFile) write(fill func(io.Writer) error) error {
	if o.name == "-" {
		return fill(o.stdout)
	}
	if o.f == nil {
		return fmt.Errorf("%s: already written", o.name)
	}
	f := o.f
	o.f = nil
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
		if err := f.Truncate(0); err != nil {
			return errors.Join(err, f.Close())
		}
	}
	bw := bufio.NewWriter(f)
	if err := fill(bw); err != nil {
		return errors.Join(fmt.Errorf("%s: %w", o.name, err), f.Close())
	}
	if err := bw.Flush(); err != nil {
		return errors.Join(fmt.Errorf("%s: %w", o.name, err), f.Close())
	}
	return f.Close()
}

// discard closes a file that was never written, and removes it if open
// made it. It does nothing once write ran, or for nil.
func (o *outFile) discard() {
	if o == nil || o.f == nil {
		return
	}
	o.f.Close()
	o.f = nil
	if o.created {
		os.Remove(o.name)
	}
}
