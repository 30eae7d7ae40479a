package ipc

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cudamem/cudamem/cuda"
)

// PyTorch counts, for every CUDA storage it shares, whether a consumer
// still uses it: _share_cuda_() sets a 64-bit counter to 1 in a file of
// counters, a shared-memory object of the producer's named
// "/torch_<pid>_<number>". The consumer decrements the counter once its
// work on the memory has finished; the producer frees a storage it dropped
// only once its counter is 0.
//
// The file is torch's reference-counted mapping: a header of
// torchRefHeader bytes whose first 32-bit word counts the processes that
// use the file (the producer made it 1; each consumer adds itself while it
// writes, and whoever takes it to 0 removes the file), then the counters.
const (
	torchRefHeader = 64 // the header before the counters
	// torchRefMaxCounters bounds the file: torch makes 10,000 counters.
	// A larger file (a later torch) is accepted up to this many, and a
	// counter index is checked against the file's actual size.
	torchRefMaxCounters = 1 << 20
	// torchRefMaxName bounds a name: "/torch_" and up to three numbers.
	torchRefMaxName = 64
)

// checkTorchRef checks counter index of a file named name. It accepts
// exactly the names torch gives its counter files: "/torch_", a decimal
// number (the producer's pid), then one or two more, each after a "_",
// each of at most 20 digits. The name comes from another process and
// becomes a path below the shared-memory directory: nothing else (no other
// slash, no dots, no NUL) may pass.
func checkTorchRef(op, name string, index uint64) error {
	const prefix = "/torch_"
	bad := func(why string) error {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "torch reference-counter name %q: %s (want /torch_<pid>_<number>[_<number>])", truncName(name), why)
	}
	if len(name) > torchRefMaxName {
		return bad(fmt.Sprintf("%d bytes, at most %d", len(name), torchRefMaxName))
	}
	if len(name) <= len(prefix) || name[:len(prefix)] != prefix {
		return bad("not /torch_...")
	}
	digits := 0
	parts := 1
	for i := len(prefix); i < len(name); i++ {
		switch c := name[i]; {
		case c >= '0' && c <= '9':
			digits++
			if digits > 20 {
				return bad("a number of more than 20 digits")
			}
		case c == '_' && parts < 3 && digits > 0:
			parts, digits = parts+1, 0
		default:
			return bad(fmt.Sprintf("byte %d (%q) is not a digit or a '_' between numbers", i, c))
		}
	}
	if parts < 2 || digits == 0 {
		return bad("not two or three numbers")
	}
	if index >= torchRefMaxCounters {
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "torch reference counter %d of %s: at most %d counters in a file", index, name, torchRefMaxCounters)
	}
	return nil
}

// truncName keeps a hostile name's message short.
func truncName(s string) string {
	if len(s) > torchRefMaxName {
		return s[:torchRefMaxName] + "..."
	}
	return s
}

// torchRefKey names one counter: the file (its device and inode, so a
// file removed and made again under the same name is another) and the
// index.
type torchRefKey struct {
	dev, ino, index uint64
}

// torchRef is one counter this process holds, released once when the last
// Buffer opened with it closes. Its file was checked when it was opened
// and is kept open (not mapped) until then.
type torchRef struct {
	key   torchRefKey
	name  string
	index uint64
	file  torchRefFile
	opens int // Buffers open on it; under torchRefs.mu
}

// torchRefs are the counters held, so that a share opened twice (two
// OpenLegacy calls with one LegacyHandle) is released once, after both.
var torchRefs struct {
	sync.Mutex
	m map[torchRefKey]*torchRef
}

// acquireTorchRef opens and checks counter index of the file name (see
// openTorchRefFile), or counts another use of it if this process holds it
// already. Nothing is written to the file until release.
func acquireTorchRef(op, name string, index uint64) (*torchRef, error) {
	if err := checkTorchRef(op, name, index); err != nil {
		return nil, err
	}
	// Opened and checked under the lock, so that a ReleaseTorch of the
	// same share comes wholly before (the counter then reads 0, and the
	// open is refused) or after (refused: open here).
	torchRefs.Lock()
	defer torchRefs.Unlock()
	f, key, err := openTorchRefFile(op, name, index)
	if err != nil {
		return nil, err
	}
	if r := torchRefs.m[key]; r != nil {
		r.opens++
		if cerr := f.close(); cerr != nil {
			// r's own descriptor is intact: only the duplicate failed.
			r.opens--
			return nil, &cuda.OpError{Op: op, Err: cerr}
		}
		return r, nil
	}
	r := &torchRef{key: key, name: name, index: index, file: f, opens: 1}
	if torchRefs.m == nil {
		torchRefs.m = map[torchRefKey]*torchRef{}
	}
	torchRefs.m[key] = r
	return r, nil
}

// release ends a use of r; the last one closes the file. With unmapped
// (the memory is unmapped) it first decrements the producer's counter (a
// failure is reported, never retried: a second decrement could release
// another's); without (an OpenLegacy that failed) the counter is left as
// it was, for the share to be opened again or given up (ReleaseTorch).
func (r *torchRef) release(unmapped bool) error {
	torchRefs.Lock()
	defer torchRefs.Unlock()
	if r.opens--; r.opens > 0 {
		return nil
	}
	delete(torchRefs.m, r.key)
	if !unmapped {
		return r.file.close()
	}
	err := r.file.releaseCounter(r.name, r.index)
	if cerr := r.file.close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return fmt.Errorf("releasing torch's reference counter %d of %s: %w", r.index, r.name, err)
	}
	return nil
}

// ReleaseTorch tells the producer of h that this process is done with
// it without mapping it: it decrements h's reference counter, as torch's
// own consumer does for a share it does not open. A handle without
// RefCounter has nothing to release (nil). A share open here (a Buffer of
// OpenLegacy not yet closed) is refused with an error matching
// cuda.ErrInvalidArgument: its Close releases it. The name and index are
// checked as OpenLegacy checks them; releasing h twice is an error (its
// counter is already 0).
func ReleaseTorch(h LegacyHandle) error {
	const op = "ipc.ReleaseTorch"
	if h.RefCounter == "" {
		return nil
	}
	if err := checkTorchRef(op, h.RefCounter, h.RefCounterOffset); err != nil {
		return err
	}
	torchRefs.Lock()
	defer torchRefs.Unlock()
	f, key, err := openTorchRefFile(op, h.RefCounter, h.RefCounterOffset)
	if err != nil {
		return err
	}
	if r := torchRefs.m[key]; r != nil {
		err := cuda.Errorf(op, cuda.ErrInvalidArgument, "torch reference counter %d of %s belongs to %d Buffer(s) open here: closing them releases it", h.RefCounterOffset, h.RefCounter, r.opens)
		return errors.Join(err, f.close())
	}
	err = f.releaseCounter(h.RefCounter, h.RefCounterOffset)
	if cerr := f.close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return &cuda.OpError{Op: op, Err: fmt.Errorf("torch reference counter %d of %s: %w", h.RefCounterOffset, h.RefCounter, err)}
	}
	return nil
}
