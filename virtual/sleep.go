package virtual

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"sort"
	"time"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/asleep"
	"github.com/cudamem/cudamem/resource/timeline"
)

// ErrAsleep is matched (errors.Is) by the error of every use of memory
// that is asleep: a Buffer call over it, a kernel launched through cudamem
// with a pointer into it, an allocation a sub-allocator would carve out of
// it. errors.As gives the *AsleepError, which names the tag.
var ErrAsleep = errors.New("memory is asleep")

// AsleepError is the error of a use of an allocation that is asleep.
type AsleepError struct {
	Tag  string         // the allocation's tag
	Addr cuda.DevicePtr // the allocation's base address
	Size uint64         // its size in bytes
}

func (e *AsleepError) Error() string {
	if e == nil {
		return ErrAsleep.Error()
	}
	return fmt.Sprintf("%v: allocation %#x (%d bytes, tag %q) was put to sleep (Resource.Sleep); wake it first", ErrAsleep, uint64(e.Addr), e.Size, e.Tag)
}

// Is makes the error match ErrAsleep.
func (e *AsleepError) Is(target error) bool { return target == ErrAsleep }

// Backup says where Sleep keeps the contents of the memory it releases.
type Backup uint8

const (
	// Discard keeps nothing: after Wake the memory's contents are
	// undefined. The fastest sleep: unmapping and releasing only.
	Discard Backup = iota
	// BackupToHost copies the contents to pinned host memory, at the
	// bus's speed, and Wake copies them back.
	BackupToHost
	// BackupToWriter streams the contents to SleepOptions.Writer (a file,
	// a socket) through pinned staging memory; Wake reads them back from
	// WakeOptions.Reader.
	BackupToWriter
)

func (b Backup) String() string {
	switch b {
	case Discard:
		return "discard"
	case BackupToHost:
		return "host"
	case BackupToWriter:
		return "writer"
	}
	return fmt.Sprintf("Backup(%d)", uint8(b))
}

// SleepOptions configure Sleep. Nil means the zero value: Discard.
type SleepOptions struct {
	Backup Backup
	// Writer receives the contents with BackupToWriter: a stream of
	// records, one per allocation (its address, size, bytes and a CRC-32C
	// checksum), which Wake reads back. Write errors fail the Sleep, which
	// then leaves everything awake.
	Writer io.Writer
}

// WakeOptions configure Wake. Nil means the zero value.
type WakeOptions struct {
	// Reader gives back what a Sleep with BackupToWriter wrote, from its
	// start. Records of allocations that this Wake does not wake are
	// skipped; a record that is missing, truncated, of the wrong size or
	// whose checksum does not match fails the Wake, which then leaves
	// everything asleep (the reader is consumed: rewind it to retry).
	Reader io.Reader
	// KeepHostBackup keeps the pinned host memory of a BackupToHost
	// backup after the Wake, for the next Sleep with BackupToHost to copy
	// into instead of pinning new memory (pinning costs far more than the
	// copy). DropHostBackup frees it.
	KeepHostBackup bool
}

// SleepStats describes one tag's sleeping memory and history.
type SleepStats struct {
	Tag string
	// Asleep is the bytes of physical memory released by the tag's
	// sleeping allocations (their mapped size), and Allocations their
	// number.
	Asleep      uint64
	Allocations int
	// Backup is the bytes of contents kept for them (in host memory or
	// written out).
	Backup uint64
	// Sleeps and Wakes count the calls that put allocations of the tag to
	// sleep and woke them; LastSleep and LastWake are the last ones' wall
	// time (the whole call), SleepTime and WakeTime the totals.
	Sleeps, Wakes       uint64
	LastSleep, LastWake time.Duration
	SleepTime, WakeTime time.Duration
	// SleptBytes and WokeBytes are the bytes put to sleep and woken, in
	// total.
	SleptBytes, WokeBytes uint64
}

// slept is an allocation's state while asleep.
type slept struct {
	sizes  []uint64 // the chunks' sizes, to create again in order
	mapped uint64   // their total: the allocation's mapped size before
	backup Backup
	host   *hostBackup // BackupToHost: shared by the allocations of one Sleep
	off    uint64      // where a's contents start in host.mem
}

// hostBackup is the pinned host memory of one Sleep with BackupToHost.
// refs (under Resource.mu) counts the allocations whose contents it holds.
type hostBackup struct {
	mem  []byte
	refs int
}

// AllocateTagged is Allocate with the allocation in tag instead of
// Options.Tag: tags select what Sleep and Wake put to sleep and wake.
func (r *Resource) AllocateTagged(tag string, size uint64, s *cuda.Stream) (*buffer.Buffer, error) {
	ptr, s, err := r.allocate(size, s, tag)
	if err != nil {
		return nil, err
	}
	return buffer.Owned(ptr, size, r, s), nil
}

// matches reports whether tag is among tags (every tag when tags is
// empty).
func matches(tags []string, tag string) bool {
	return len(tags) == 0 || slices.Contains(tags, tag)
}

// claimLocked claims the allocations of tags that are asleep (wantAsleep)
// or awake, for one Sleep or Wake, under r.mu, in address order. An
// allocation another call owns fails the claim, which then claims nothing.
func (r *Resource) claimLocked(op string, tags []string, wantAsleep bool) ([]*allocation, error) {
	var out []*allocation
	for _, a := range r.allocs {
		if !matches(tags, a.tag) || (a.sleep != nil) != wantAsleep || a.size == 0 {
			continue
		}
		if a.claimed {
			return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "allocation %#x (tag %q) is being changed by another call (Grow, Shrink, Sleep or Wake)", uint64(a.base), a.tag)
		}
		if !wantAsleep && a.shared != "" {
			return nil, cuda.Errorf(op, cuda.ErrInvalidArgument, "allocation %#x (tag %q) was %s: other processes map its physical memory, which sleep would pull from under them", uint64(a.base), a.tag, a.shared)
		}
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].base < out[j].base })
	for _, a := range out {
		a.claimed = true
	}
	return out, nil
}

// unclaim ends the claims of as, and frees those that a Close asked to
// free meanwhile (see Deallocate).
func (r *Resource) unclaim(as []*allocation) error {
	var free []*allocation
	r.mu.Lock()
	for _, a := range as {
		if f := r.endResizeLocked(a); f != nil {
			free = append(free, f)
		}
	}
	r.mu.Unlock()
	var errs []error
	for _, a := range free {
		if err := r.freeLeft(a); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (r *Resource) tagsOf(as []*allocation) []string {
	var tags []string
	for _, a := range as {
		if !slices.Contains(tags, a.tag) {
			tags = append(tags, a.tag)
		}
	}
	return tags
}

// Sleep releases the physical memory of every awake allocation whose tag
// is in tags (every allocation when tags is empty) and keeps its address
// range: the addresses stay valid, reserved for Wake to map again, so
// pointers held elsewhere (CUDA graphs, NCCL's registrations, kernels'
// arguments) need not change.
//
// Sleep first waits for all work queued on the device; calls through
// cudamem that use the memory must have returned (as before any free).
// From the moment Sleep begins, every use of the memory through cudamem
// is refused with an error matching ErrAsleep that names the tag (see
// AsleepError): Buffer calls, kernel launches through cudamem, exports.
// CUDA graphs and foreign code that hold the addresses must not run until
// Wake. Options.Segments' Released hook runs for each allocation before
// its memory goes.
//
// The contents are discarded or backed up (SleepOptions.Backup). Sleep is
// all or nothing: until every allocation's backup is complete, a failure
// (a hook, the host memory, a copy, the writer) leaves everything awake
// and as it was. Once the backup is complete the call finishes: every
// allocation ends asleep with its backup, and physical memory the driver
// refuses to give back is kept and retried (by later calls, Wake first,
// and Reclaim); the error then wraps buffer.ErrPartlyFreed.
//
// Allocations exported to other processes (Export, ExportFabric) or
// imported from one cannot sleep: their physical memory is shared. Sleep
// of allocations that are all asleep already, or of tags without
// allocations, does nothing. Sleeping while a stream of the device
// captures is refused (cuda.ErrCapturing: waiting for the device would
// invalidate the capture), and so is sleeping while a Grow, Shrink or Wake
// owns one of the allocations; either leaves everything awake.
func (r *Resource) Sleep(opts *SleepOptions, tags ...string) error {
	const op = "Resource.Sleep"
	if err := r.check(op); err != nil {
		return err
	}
	var o SleepOptions
	if opts != nil {
		o = *opts
	}
	switch {
	case o.Backup > BackupToWriter:
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "unknown Backup %d", uint8(o.Backup))
	case o.Backup == BackupToWriter && o.Writer == nil:
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "Backup BackupToWriter needs a Writer")
	case o.Backup != BackupToWriter && o.Writer != nil:
		return cuda.Errorf(op, cuda.ErrInvalidArgument, "a Writer is only for Backup BackupToWriter (Backup is %v)", o.Backup)
	}
	start := time.Now()
	r.phase.Lock()
	defer r.phase.Unlock()
	r.retryLeftovers()
	r.mu.Lock()
	as, err := r.claimLocked(op, tags, false)
	r.mu.Unlock()
	if err != nil || len(as) == 0 {
		return err
	}
	// From here on no new use starts: each range refuses, naming its tag.
	for _, a := range as {
		asleep.Add(uint64(a.base), a.mapped, &AsleepError{Tag: a.tag, Addr: a.base, Size: a.size})
	}
	undo := func(err error, released int) error {
		err = errors.Join(err, r.undoHooks(op, as[:released], true))
		for _, a := range as {
			asleep.Remove(uint64(a.base))
		}
		return fmt.Errorf("%s (everything stays awake): %w", op, errors.Join(err, r.unclaim(as)))
	}
	if err := r.drv.syncDevice(); err != nil {
		return undo(fmt.Errorf("waiting for the device: %w", err), 0)
	}
	if n, err := r.runHooks(op, as, false); err != nil {
		return undo(err, n)
	}
	var host *hostBackup
	switch o.Backup {
	case BackupToHost:
		host, err = r.backupToHost(as)
	case BackupToWriter:
		err = r.backupToWriter(as, o.Writer)
	}
	if err != nil {
		return undo(err, len(as))
	}
	// The backup is complete: past this point the call finishes.
	var l leftovers
	for _, a := range as {
		r.release(a, &l)
	}
	rerr := reap(r.drv, &l)
	r.left.keep(&l)
	d := time.Since(start)
	r.mu.Lock()
	var off uint64
	for _, a := range as {
		s := &slept{mapped: a.mapped, backup: o.Backup, host: host, off: off}
		off += a.mapped
		for _, c := range a.chunks {
			s.sizes = append(s.sizes, c.size)
		}
		a.chunks, a.mapped, a.sleep = nil, 0, s
	}
	if host != nil {
		host.refs = len(as)
	}
	for _, a := range as {
		st := r.statsLocked(a.tag)
		st.Asleep += a.sleep.mapped
		st.Allocations++
		st.SleptBytes += a.sleep.mapped
		if o.Backup != Discard {
			st.Backup += a.sleep.mapped
		}
	}
	for _, tag := range r.tagsOf(as) {
		st := r.statsLocked(tag)
		st.Sleeps++
		st.LastSleep = d
		st.SleepTime += d
	}
	r.mu.Unlock()
	r.record(timeline.Sleep, as, d)
	err = r.unclaim(as)
	if rerr != nil {
		err = errors.Join(fmt.Errorf("%s: %w (what was not given back is kept for a retry; see Reclaim): %w", op, buffer.ErrPartlyFreed, rerr), err)
	}
	return err
}

// release unmaps a's chunks and releases them, forward only: what the
// driver refuses goes into l. The caller then empties a.chunks.
func (r *Resource) release(a *allocation, l *leftovers) {
	// One unmap for the whole allocation (the driver unmaps a run of
	// mappings at once); chunk by chunk only if that fails.
	if len(a.chunks) > 0 {
		if err := r.drv.MemUnmap(a.base, a.mapped); err != nil {
			for _, c := range a.chunks {
				at := a.base + cuda.DevicePtr(c.off)
				if err := r.drv.MemUnmap(at, c.size); err != nil {
					l.maps = append(l.maps, span{at, c.size})
				}
			}
		}
	}
	for _, c := range a.chunks {
		l.handles = append(l.handles, c.h)
	}
}

// backupToHost copies the contents of as to pinned host memory, in order,
// back to back: the spare if it is large enough, else new memory. On
// error nothing is kept.
func (r *Resource) backupToHost(as []*allocation) (*hostBackup, error) {
	var total uint64
	for _, a := range as {
		total += a.mapped
	}
	mem := r.takeSpare(total)
	if mem == nil {
		var err error
		if mem, err = r.drv.hostAlloc(total); err != nil {
			return nil, fmt.Errorf("pinning %d bytes of host memory for the backup: %w", total, err)
		}
	}
	var off uint64
	for _, a := range as {
		if err := r.drv.copyDtoH(mem[off:off+a.mapped], a.base); err != nil {
			err = fmt.Errorf("copying %#x (%d bytes) to host memory: %w", uint64(a.base), a.mapped, err)
			return nil, errors.Join(err, r.freeHost(mem, true))
		}
		off += a.mapped
	}
	return &hostBackup{mem: mem}, nil
}

// takeSpare returns the spare if it holds n bytes (taking it), else nil.
func (r *Resource) takeSpare(n uint64) []byte {
	r.spareMu.Lock()
	defer r.spareMu.Unlock()
	if uint64(len(r.spare)) < n {
		return nil
	}
	mem := r.spare
	r.spare = nil
	return mem
}

// freeHost frees pinned host memory, or keeps it as the spare (keep, or
// when the free fails: nothing is lost, the error wraps
// buffer.ErrPartlyFreed, and DropHostBackup retries): the larger of it and
// the current spare stays, the other is freed.
func (r *Resource) freeHost(mem []byte, keep bool) error {
	var ferr error
	if !keep {
		err := r.drv.hostFree(mem)
		if err == nil {
			return nil
		}
		ferr = fmt.Errorf("freeing %d bytes of pinned host memory: %w (kept for a retry; see DropHostBackup): %w", len(mem), buffer.ErrPartlyFreed, err)
	}
	r.spareMu.Lock()
	if len(mem) >= len(r.spare) {
		mem, r.spare = r.spare, mem // the larger stays; free the old spare
	}
	r.spareMu.Unlock()
	if mem == nil {
		return ferr
	}
	if err := r.drv.hostFree(mem); err != nil {
		// Both are pinned memory this resource owns; the larger stays as
		// the spare, the other's free failed twice.
		return errors.Join(ferr, fmt.Errorf("freeing %d bytes of pinned host memory: %w (it is lost until the process exits)", len(mem), err))
	}
	return ferr
}

// copyStream returns the stream Wake copies host backups back on, made
// on first need and kept (DropHostBackup closes it). Called with r.phase
// held.
func (r *Resource) copyStream() (*cuda.Stream, error) {
	if !r.hasCopies {
		s, err := r.drv.newStream()
		if err != nil {
			return nil, fmt.Errorf("creating the stream that copies backups back: %w", err)
		}
		r.copies, r.hasCopies = s, true
	}
	return r.copies, nil
}

// DropHostBackup frees what Sleep and Wake keep for the next time: the
// spare pinned host memory (what a Wake with WakeOptions.KeepHostBackup
// kept, or what an earlier free failed to give back) and the stream Wake
// copies on.
func (r *Resource) DropHostBackup() error {
	const op = "Resource.DropHostBackup"
	if err := r.check(op); err != nil {
		return err
	}
	r.phase.Lock()
	if r.hasCopies {
		if err := r.drv.closeStream(r.copies); err != nil {
			r.phase.Unlock()
			return &cuda.OpError{Op: op, Err: fmt.Errorf("closing the copy stream: %w (kept for a retry)", err)}
		}
		r.copies, r.hasCopies = nil, false
	}
	r.phase.Unlock()
	r.spareMu.Lock()
	mem := r.spare
	r.spare = nil
	r.spareMu.Unlock()
	if mem == nil {
		return nil
	}
	if err := r.drv.hostFree(mem); err != nil {
		return &cuda.OpError{Op: op, Err: errors.Join(fmt.Errorf("freeing %d bytes of pinned host memory: %w", len(mem), err), r.freeHost(mem, true))}
	}
	return nil
}

// The backup stream of BackupToWriter: a magic header, then per
// allocation its base address and size (little-endian uint64s), its bytes
// and their CRC-32C, then a record of address 0 and size 0.
var (
	streamMagic = [8]byte{'c', 'u', 'd', 'a', 'm', 'e', 'm', 'z'}
	crcTable    = crc32.MakeTable(crc32.Castagnoli)
)

// wakePiece is the most physical memory Wake creates in one chunk when it
// copies a host backup back, so that creating the next piece overlaps the
// copy into the last one. An allocation's chunks after a Wake may
// therefore be more, and smaller, than before its Sleep.
const wakePiece = 512 << 20

// wakeSizes splits sizes, the chunks of a sleeping allocation, into
// pieces, in order: the first of 64 MiB, each next twice the last up to
// wakePiece (each rounded down to the granularity, at least one granule),
// so that the copies start early and the pieces are soon large.
func (r *Resource) wakeSizes(sizes []uint64) []uint64 {
	piece := uint64(64 << 20)
	var out []uint64
	for _, s := range sizes {
		for {
			p := max(piece/r.gran*r.gran, r.gran)
			if s <= p {
				out = append(out, s)
				break
			}
			out = append(out, p)
			s -= p
			piece = min(2*piece, wakePiece)
		}
	}
	return out
}

// stageSize is the pinned staging memory that backups to and from a
// stream copy through, a piece at a time.
const stageSize = 64 << 20

// staging returns pinned staging memory of up to stageSize bytes for as
// (n bytes in total), from the spare host backup where there is one.
func (r *Resource) staging(n uint64) (stage []byte, free func() error, err error) {
	n = min(n, stageSize)
	if mem := r.takeSpare(n); mem != nil {
		return mem[:n], func() error { return r.freeHost(mem, true) }, nil
	}
	mem, err := r.drv.hostAlloc(n)
	if err != nil {
		return nil, nil, fmt.Errorf("pinning %d bytes of staging memory: %w", n, err)
	}
	return mem, func() error { return r.freeHost(mem, false) }, nil
}

func (r *Resource) backupToWriter(as []*allocation, w io.Writer) (err error) {
	var total uint64
	for _, a := range as {
		total += a.mapped
	}
	stage, free, err := r.staging(total)
	if err != nil {
		return err
	}
	defer func() {
		if ferr := free(); ferr != nil {
			err = errors.Join(err, fmt.Errorf("freeing the staging memory: %w", ferr))
		}
	}()
	if _, err := w.Write(streamMagic[:]); err != nil {
		return fmt.Errorf("writing the backup: %w", err)
	}
	var hdr [16]byte
	for _, a := range as {
		binary.LittleEndian.PutUint64(hdr[:8], uint64(a.base))
		binary.LittleEndian.PutUint64(hdr[8:], a.mapped)
		if _, err := w.Write(hdr[:]); err != nil {
			return fmt.Errorf("writing the backup of %#x: %w", uint64(a.base), err)
		}
		crc := uint32(0)
		for off := uint64(0); off < a.mapped; {
			n := min(uint64(len(stage)), a.mapped-off)
			if err := r.drv.copyDtoH(stage[:n], a.base+cuda.DevicePtr(off)); err != nil {
				return fmt.Errorf("copying %#x+%d (%d bytes) to host memory: %w", uint64(a.base), off, n, err)
			}
			if _, err := w.Write(stage[:n]); err != nil {
				return fmt.Errorf("writing the backup of %#x: %w", uint64(a.base), err)
			}
			crc = crc32.Update(crc, crcTable, stage[:n])
			off += n
		}
		binary.LittleEndian.PutUint32(hdr[:4], crc)
		if _, err := w.Write(hdr[:4]); err != nil {
			return fmt.Errorf("writing the backup of %#x: %w", uint64(a.base), err)
		}
	}
	clear(hdr[:])
	if _, err := w.Write(hdr[:]); err != nil {
		return fmt.Errorf("writing the backup: %w", err)
	}
	return nil
}

// Wake maps physical memory again, at the same addresses, under every
// sleeping allocation whose tag is in tags (every one when tags is
// empty), with the access it had, and restores the contents from the
// backup Sleep made. Options.Segments' Acquired hook runs for each
// allocation once its contents are back. Wake is all or nothing: a
// failure (out of memory, a copy, the reader, a hook) gives back what it
// mapped and leaves every allocation asleep with its backup intact, and
// the error says why; call Wake again once the cause is gone.
//
// A host backup is copied back while the memory under the next piece is
// made, in chunks of at most 512 MiB: after a Wake an allocation may hold
// more, smaller chunks than before its Sleep (Info counts them).
//
// Allocations that slept with BackupToWriter need WakeOptions.Reader.
// Waking allocations that are awake, or tags without allocations, does
// nothing.
func (r *Resource) Wake(opts *WakeOptions, tags ...string) (err error) {
	const op = "Resource.Wake"
	if err := r.check(op); err != nil {
		return err
	}
	var o WakeOptions
	if opts != nil {
		o = *opts
	}
	start := time.Now()
	r.phase.Lock()
	defer r.phase.Unlock()
	r.retryLeftovers() // a mapping left in a sleeping range would block its map
	r.mu.Lock()
	as, err := r.claimLocked(op, tags, true)
	r.mu.Unlock()
	if err != nil || len(as) == 0 {
		return err
	}
	fail := func(err error) error {
		return fmt.Errorf("%s (everything stays asleep, its backup intact): %w", op, errors.Join(err, r.unclaim(as)))
	}
	for _, a := range as {
		if a.sleep.backup == BackupToWriter && o.Reader == nil {
			return fail(cuda.Errorf(op, cuda.ErrInvalidArgument, "allocation %#x (tag %q) slept with BackupToWriter: WakeOptions.Reader must give its backup back", uint64(a.base), a.tag))
		}
	}
	// Copies from host backups run on a stream of their own while the
	// next piece is created and mapped: making physical memory costs
	// about a tenth of copying into it, and this hides it.
	var cs *cuda.Stream
	for _, a := range as {
		if a.sleep.backup == BackupToHost && cs == nil {
			if cs, err = r.copyStream(); err != nil {
				return fail(err)
			}
		}
	}
	var t txn
	t.start()
	undo := func(err error) error {
		// No copy may still run into memory about to be unmapped.
		if cs != nil {
			if serr := r.drv.syncStream(cs); serr != nil {
				err = errors.Join(err, fmt.Errorf("waiting for the copies: %w", serr))
				if derr := r.drv.syncDevice(); derr != nil {
					err = errors.Join(err, fmt.Errorf("waiting for the device: %w", derr))
				}
			}
		}
		return fail(r.rollback(&t, err))
	}
	chunks := make([][]chunk, len(as))
	for i, a := range as {
		var off uint64
		for _, size := range r.wakeSizes(a.sleep.sizes) {
			at := a.base + cuda.DevicePtr(off)
			h, err := r.newChunk(&t, at, size, a.descs)
			if err != nil {
				return undo(fmt.Errorf("mapping %d bytes at %#x (tag %q): %w", size, uint64(at), a.tag, err))
			}
			chunks[i] = append(chunks[i], chunk{off: off, size: size, h: h})
			if h := a.sleep.host; h != nil {
				from := a.sleep.off + off
				if err := r.drv.copyHtoDAsync(at, h.mem[from:from+size], cs); err != nil {
					return undo(fmt.Errorf("copying %#x (%d bytes) back from host memory: %w", uint64(at), size, err))
				}
			}
			off += size
		}
	}
	if cs != nil {
		if err := r.drv.syncStream(cs); err != nil {
			return undo(fmt.Errorf("copying the backups back: %w", err))
		}
	}
	if err := r.restoreStream(as, o.Reader); err != nil {
		return undo(err)
	}
	if n, err := r.runHooks(op, as, true); err != nil {
		rerr := r.undoHooks(op, as[:n], false)
		return fail(r.rollback(&t, errors.Join(err, rerr)))
	}
	// Everything is back: commit.
	d := time.Since(start)
	var frees [][]byte
	r.mu.Lock()
	for i, a := range as {
		s := a.sleep
		a.chunks, a.mapped, a.sleep = chunks[i], s.mapped, nil
		if h := s.host; h != nil {
			if h.refs--; h.refs == 0 {
				frees = append(frees, h.mem)
			}
		}
		st := r.statsLocked(a.tag)
		st.Asleep -= s.mapped
		st.Allocations--
		st.WokeBytes += s.mapped
		if s.backup != Discard {
			st.Backup -= s.mapped
		}
		asleep.Remove(uint64(a.base))
	}
	for _, tag := range r.tagsOf(as) {
		st := r.statsLocked(tag)
		st.Wakes++
		st.LastWake = d
		st.WakeTime += d
	}
	r.mu.Unlock()
	r.record(timeline.Wake, as, d)
	var errs []error
	for _, mem := range frees {
		if err := r.freeHost(mem, o.KeepHostBackup); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, r.unclaim(as))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s (the memory is awake): %w", op, err)
	}
	return nil
}

// restoreStream reads a backup stream, copying the records of the
// allocations of as that slept with BackupToWriter into their memory and
// skipping the others. The stream is hostile input: sizes are compared
// with what the allocations had, never used to allocate.
func (r *Resource) restoreStream(as []*allocation, rd io.Reader) (err error) {
	want := map[cuda.DevicePtr]*allocation{}
	var total uint64
	for _, a := range as {
		if a.sleep.backup == BackupToWriter {
			want[a.base] = a
			total += a.sleep.mapped
		}
	}
	if len(want) == 0 {
		return nil
	}
	stage, free, err := r.staging(total)
	if err != nil {
		return err
	}
	defer func() {
		if ferr := free(); ferr != nil {
			err = errors.Join(err, fmt.Errorf("freeing the staging memory: %w", ferr))
		}
	}()
	// A malformed stream is an invalid argument; one that ends early is
	// too, and keeps the reader's error (io.ErrUnexpectedEOF, say); any
	// other read error is the reader's own, wrapped.
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: the backup stream "+format, append([]any{cuda.ErrInvalidArgument}, args...)...)
	}
	readErr := func(err error, where string) error {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%w: the backup stream ends in %s: %w", cuda.ErrInvalidArgument, where, err)
		}
		return fmt.Errorf("reading %s of the backup stream: %w", where, err)
	}
	var hdr [16]byte
	if _, err := io.ReadFull(rd, hdr[:8]); err != nil {
		return readErr(err, "its header")
	}
	if [8]byte(hdr[:8]) != streamMagic {
		return bad("does not start as a backup stream does (header %q)", hdr[:8])
	}
	for {
		if _, err := io.ReadFull(rd, hdr[:]); err != nil {
			return readErr(err, "a record's header")
		}
		base := cuda.DevicePtr(binary.LittleEndian.Uint64(hdr[:8]))
		size := binary.LittleEndian.Uint64(hdr[8:])
		if base == 0 && size == 0 {
			break
		}
		a, ok := want[base]
		if !ok {
			// Another allocation's record: skip it, with its checksum.
			if size > 1<<62 {
				return bad("has a record of %d bytes at %#x", size, uint64(base))
			}
			if _, err := io.CopyN(io.Discard, rd, int64(size)+4); err != nil {
				return readErr(err, fmt.Sprintf("the record of %#x", uint64(base)))
			}
			continue
		}
		if size != a.sleep.mapped {
			return bad("has %d bytes for %#x, which had %d", size, uint64(base), a.sleep.mapped)
		}
		crc := uint32(0)
		for off := uint64(0); off < size; {
			n := min(uint64(len(stage)), size-off)
			if _, err := io.ReadFull(rd, stage[:n]); err != nil {
				return readErr(err, fmt.Sprintf("the record of %#x", uint64(base)))
			}
			crc = crc32.Update(crc, crcTable, stage[:n])
			if err := r.drv.copyHtoD(a.base+cuda.DevicePtr(off), stage[:n]); err != nil {
				return fmt.Errorf("copying %#x+%d (%d bytes) back: %w", uint64(a.base), off, n, err)
			}
			off += n
		}
		if _, err := io.ReadFull(rd, hdr[:4]); err != nil {
			return readErr(err, fmt.Sprintf("the record of %#x", uint64(base)))
		}
		if got := binary.LittleEndian.Uint32(hdr[:4]); got != crc {
			return bad("record of %#x is corrupt (CRC-32C %#08x, the bytes give %#08x)", uint64(base), got, crc)
		}
		delete(want, base)
	}
	for base := range want {
		return bad("has no record of %#x (tag %q)", uint64(base), want[base].tag)
	}
	return nil
}

// undoHooks runs the hook that undoes another's (Acquired after
// Released, acquired true; Released after Acquired, false) for each of
// as, every one whatever fails, and joins the failures.
func (r *Resource) undoHooks(op string, as []*allocation, acquired bool) error {
	var errs []error
	for i := range as {
		if _, err := r.runHooks(op, as[i:i+1], acquired); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// runHooks runs Options.Segments.Acquired (acquired) or Released for as,
// in order, stopping at the first failure (a panic is one), and returns
// how many succeeded.
func (r *Resource) runHooks(op string, as []*allocation, acquired bool) (n int, err error) {
	h := r.opts.Segments
	if h == nil {
		return len(as), nil
	}
	f, name := h.Released, "Released"
	if acquired {
		f, name = h.Acquired, "Acquired"
	}
	if f == nil {
		return len(as), nil
	}
	for i, a := range as {
		err := func() (err error) {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("panic: %v", p)
				}
			}()
			size := a.mapped
			if a.sleep != nil {
				size = a.sleep.mapped
			}
			return f(a.base, size)
		}()
		if err != nil {
			return i, fmt.Errorf("%s: segment hook %s for %#x (tag %q): %w", op, name, uint64(a.base), a.tag, err)
		}
	}
	return len(as), nil
}

// record logs a Sleep or Wake of as in Options.Timeline, if set. Their
// sizes are read under their claim: Sleep's from the sleep state, Wake's
// from the memory mapped again.
func (r *Resource) record(k timeline.Kind, as []*allocation, d time.Duration) {
	l := r.opts.Timeline
	if l == nil {
		return
	}
	dev := r.DeviceID()
	for _, a := range as {
		size := a.mapped
		if a.sleep != nil {
			size = a.sleep.mapped
		}
		_ = l.Record(timeline.Event{Kind: k, Addr: uint64(a.base), Size: size, Device: dev, Resource: "virtual", Tag: a.tag, Duration: d})
	}
}

// statsLocked returns tag's statistics, made on first need.
func (r *Resource) statsLocked(tag string) *SleepStats {
	if r.stats == nil {
		r.stats = map[string]*SleepStats{}
	}
	st := r.stats[tag]
	if st == nil {
		st = &SleepStats{Tag: tag}
		r.stats[tag] = st
	}
	return st
}

// SleepStats returns the statistics of every tag that has slept, sorted
// by tag.
func (r *Resource) SleepStats() []SleepStats {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]SleepStats, 0, len(r.stats))
	for _, st := range r.stats {
		out = append(out, *st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tag < out[j].Tag })
	return out
}

// forgetSleep drops the sleep of an allocation being freed: its range no
// longer refuses uses (the address may be handed out again) and its host
// backup is let go, freed with its last allocation. Called without r.mu.
func (r *Resource) forgetSleep(a *allocation) error {
	s := a.sleep
	if s == nil {
		return nil
	}
	a.sleep = nil
	asleep.Remove(uint64(a.base))
	var free []byte
	r.mu.Lock()
	st := r.statsLocked(a.tag)
	st.Asleep -= s.mapped
	st.Allocations--
	if s.backup != Discard {
		st.Backup -= s.mapped
	}
	if h := s.host; h != nil {
		if h.refs--; h.refs == 0 {
			free = h.mem
		}
	}
	r.mu.Unlock()
	if free == nil {
		return nil
	}
	return r.freeHost(free, false)
}
