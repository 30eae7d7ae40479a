package main

import (
	"bufio"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
)

// outFile is an output file named on the command line. It is opened
// before the work that fills it, so a name that cannot be written fails
// at once rather than after a long run. A regular file is written to a
// temporary file beside it and renamed over it only once complete: a
// command that fails, at any point, leaves what was there before (or
// nothing) and no partial output. Standard output ("-") and files that
// are not regular (a terminal, /dev/null, a pipe) are written in place.
type outFile struct {
	name   string // as given on the command line
	flag   string // the flag that named it, for errors ("-o")
	stdout io.Writer
	path   string   // where the output goes: name with symbolic links resolved
	tmp    *os.File // the temporary file (regular outputs), until write or discard
	direct *os.File // a file that is not regular, written in place
	ready  bool     // prepared: the temporary file holds the output
	done   bool     // written or discarded
}

// openOut opens the output named by flag (name; "-" is stdout).
func openOut(flag, name string, stdout io.Writer) (*outFile, error) {
	o := &outFile{name: name, flag: flag, stdout: stdout}
	if name == "-" {
		return o, nil
	}
	o.path = name
	if p, err := filepath.EvalSymlinks(name); err == nil {
		o.path = p // a link is followed, as os.Create would
	}
	st, err := os.Stat(o.path)
	switch {
	case err == nil && st.IsDir():
		return nil, fmt.Errorf("%s %s: is a directory, not a file to write", flag, name)
	case err == nil && !st.Mode().IsRegular():
		// A device or a pipe: renaming over it would replace it.
		f, err := os.OpenFile(o.path, os.O_WRONLY, 0)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", flag, err) // *fs.PathError: names the file
		}
		o.direct = f
		return o, nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	existed := err == nil
	mode := fs.FileMode(0o666) // less the umask, as os.Create
	if existed {
		mode = st.Mode().Perm() // an existing file keeps its permissions
	}
	if o.tmp, err = createTemp(o.path, mode); err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if existed {
		_ = o.tmp.Chmod(mode) // exactly the old file's: the umask applied at create
	}
	return o, nil
}

// createTemp makes a new file beside path (same directory, so the rename
// that replaces path is atomic) with mode less the umask.
func createTemp(path string, mode fs.FileMode) (*os.File, error) {
	dir, base := filepath.Split(path)
	for range 100 {
		var r [6]byte
		_, _ = rand.Read(r[:]) // never fails
		name := filepath.Join(dir, "."+base+".tmp-"+hex.EncodeToString(r[:]))
		temps.Lock() // held across the create, so an interrupt sees it listed
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
		if err == nil {
			temps.names[name] = true
		}
		temps.Unlock()
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if err != nil {
			// Report the file asked for, not the temporary name.
			var pe *fs.PathError
			if errors.As(err, &pe) {
				return nil, &fs.PathError{Op: "create", Path: path, Err: pe.Err}
			}
			return nil, err
		}
		return f, nil
	}
	return nil, &fs.PathError{Op: "create", Path: path, Err: fs.ErrExist}
}

// write fills the output with what fill writes and, for a regular file,
// puts it in place: prepare, then commit. On any failure the output is
// discarded: the file named keeps what it held before.
func (o *outFile) write(fill func(io.Writer) error) error {
	if err := o.prepare(fill); err != nil {
		return err
	}
	return o.commit()
}

// prepare fills the output with what fill writes: a regular file's
// temporary file, which commit then puts in place; standard output and
// files that are not regular at once. On failure the output is discarded.
func (o *outFile) prepare(fill func(io.Writer) error) (err error) {
	if o.done || o.ready {
		return fmt.Errorf("%s %s: already written", o.flag, o.name)
	}
	switch {
	case o.name == "-":
		o.done = true
		return fill(o.stdout)
	case o.direct != nil:
		o.done = true
		bw := bufio.NewWriter(o.direct)
		err := fill(bw)
		if err == nil {
			err = bw.Flush()
		}
		err = errors.Join(err, o.direct.Close())
		if err != nil {
			return fmt.Errorf("writing %s: %w", o.name, err)
		}
		return nil
	}
	f := o.tmp
	defer func() {
		if err != nil {
			o.done = true
			removeTemp(f.Name())
		}
	}()
	bw := bufio.NewWriter(f)
	if err := fill(bw); err != nil {
		return errors.Join(fmt.Errorf("writing %s: %w", o.name, err), f.Close())
	}
	if err := bw.Flush(); err != nil {
		return errors.Join(fmt.Errorf("writing %s: %w", o.name, err), f.Close())
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing %s: %w", o.name, err)
	}
	o.ready = true
	return nil
}

// commit puts a prepared output in place (renames its temporary file over
// the file named). It does nothing for outputs written at prepare.
func (o *outFile) commit() error {
	if o.done {
		return nil
	}
	if !o.ready {
		return fmt.Errorf("%s %s: not prepared", o.flag, o.name)
	}
	o.done = true
	name := o.tmp.Name()
	temps.Lock()
	err := os.Rename(name, o.path)
	if err == nil {
		delete(temps.names, name)
	}
	temps.Unlock()
	if err != nil {
		removeTemp(name)
		return fmt.Errorf("writing %s: %w", o.name, err)
	}
	return nil
}

// discard gives up an output that was not written: its temporary file is
// removed, and the file named stays as it was. It does nothing once write
// ran, or for nil.
func (o *outFile) discard() {
	if o == nil || o.done {
		return
	}
	o.done = true
	if o.tmp != nil {
		o.tmp.Close() // already closed once prepared: harmless
		removeTemp(o.tmp.Name())
	}
	if o.direct != nil {
		o.direct.Close()
	}
}

// temps are the temporary files of outputs not yet in place: an
// interrupted command removes them (see removeTempsOnSignal).
var temps = struct {
	sync.Mutex
	names map[string]bool
}{names: map[string]bool{}}

func removeTemp(name string) {
	temps.Lock()
	defer temps.Unlock()
	os.Remove(name)
	delete(temps.names, name)
}

// removeTempsOnSignal makes an interrupt or a SIGTERM remove the
// temporary files of the outputs not yet written, say so and exit with
// the status a shell gives a process killed by the signal (130 for an
// interrupt): a stopped command leaves no partial file either. stop ends
// that, for the normal exit.
func removeTempsOnSignal(stderr io.Writer) (stop func()) {
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-c:
			temps.Lock() // held to the exit: no rename or create after this
			for name := range temps.names {
				os.Remove(name)
			}
			fmt.Fprintf(stderr, "cudamem: %v: stopped; no partial output is left\n", sig)
			code := 130
			if s, ok := sig.(syscall.Signal); ok {
				code = 128 + int(s)
			}
			os.Exit(code)
		case <-done:
		}
	}()
	return func() {
		signal.Stop(c)
		close(done)
	}
}

// sameFile reports whether the file names a and b name the same file:
// the same path once cleaned and made absolute, or, where both exist, the
// same file by os.SameFile (a hard link, a symbolic link, another
// spelling). "-" (standard input or output) names only itself.
func sameFile(a, b string) bool {
	if a == "" || b == "" {
		return false
	}
	if a == "-" || b == "-" {
		return a == b
	}
	if filepath.Clean(a) == filepath.Clean(b) {
		return true
	}
	if aa, err := filepath.Abs(a); err == nil {
		if ab, err := filepath.Abs(b); err == nil && aa == ab {
			return true
		}
	}
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	if errA == nil && errB == nil {
		return os.SameFile(sa, sb)
	}
	// A link to a file not made yet: compare where the links lead.
	ra, errA := filepath.EvalSymlinks(filepath.Dir(a))
	rb, errB := filepath.EvalSymlinks(filepath.Dir(b))
	return errA == nil && errB == nil && ra == rb && filepath.Base(a) == filepath.Base(b)
}

// namedFile is a file a command line names: the flag and its value.
type namedFile struct{ flag, name string }

// checkFiles refuses, as a usage error, an output that names an input or
// another output (the same file however spelled). Empty names are flags
// not given.
func checkFiles(inputs, outputs []namedFile) error {
	for i, o := range outputs {
		if o.name == "" {
			continue
		}
		for _, in := range inputs {
			if in.name != "" && in.name != "-" && sameFile(o.name, in.name) {
				if o.name == in.name {
					return fmt.Errorf("%w: %s %s would overwrite the input %s names", errUsage, o.flag, o.name, in.flag)
				}
				return fmt.Errorf("%w: %s %s would overwrite the input %s %s (the same file)", errUsage, o.flag, o.name, in.flag, in.name)
			}
		}
		for _, p := range outputs[:i] {
			if p.name != "" && sameFile(o.name, p.name) {
				return fmt.Errorf("%w: %s and %s name the same output %q", errUsage, p.flag, o.flag, o.name)
			}
		}
	}
	return nil
}
