// Command sleep-wake shares one GPU between two phases, as a trainer and
// an inference engine do between turns: the first phase's memory is put
// to sleep (virtual.Resource.Sleep), backed up to pinned host memory or to
// a file, its physical memory given back while every address stays
// reserved; the second phase allocates the memory freed and uses it; then
// the first phase's memory is woken (Resource.Wake) at the same addresses
// and every byte checked. It prints OK with the device's free memory at
// each step.
//
// It needs a device with virtual memory management; without a driver it
// says what was tried and exits 1.
//
//	go run ./examples/sleep-wake                 # 256 MiB, host backup
//	go run ./examples/sleep-wake -mib 1024 -backup file
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/virtual"
)

const usage = `usage: sleep-wake [-mib N] [-backup host|file]

Puts a phase's GPU memory to sleep (backed up to pinned host memory or a
temporary file), lets a second phase use the memory freed, wakes the first
at the same addresses and checks every byte.
`

func main() {
	fs := flag.NewFlagSet("sleep-wake", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // the errors are printed below, once
	mib := fs.Uint64("mib", 256, "MiB of memory the first phase holds")
	backup := fs.String("backup", "host", "where the contents go while asleep: host or file")
	err := fs.Parse(os.Args[1:])
	if err == nil && fs.NArg() > 0 {
		err = fmt.Errorf("takes no arguments, got %q", fs.Args())
	}
	if err == nil && (*mib == 0 || *mib > 1<<20) {
		err = fmt.Errorf("-mib %d: want 1 to %d", *mib, 1<<20)
	}
	if err == nil && *backup != "host" && *backup != "file" {
		err = fmt.Errorf("-backup %q: want host or file", *backup)
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(os.Stderr, usage)
		os.Exit(0)
	case err != nil:
		fmt.Fprintf(os.Stderr, "sleep-wake: %v\n%s", err, usage)
		os.Exit(2)
	}
	if err := run(*mib<<20, *backup); err != nil {
		fmt.Fprintln(os.Stderr, "sleep-wake:", err)
		os.Exit(1)
	}
}

func value(i int) uint32 { return uint32(i)*2654435761 ^ 0xa5a5a5a5 }

func run(size uint64, backup string) (err error) {
	dev, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	s, err := dev.NewStream()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	freeMiB := func() uint64 {
		free, _, _ := dev.MemInfo()
		return free >> 20
	}

	// Phase one: "weights" and a "kv" cache, each in its own tag.
	mr, err := virtual.New(dev, &virtual.Options{HandleType: virtual.HandleNone, Tag: "weights"})
	if errors.Is(err, cuda.ErrNotSupported) {
		return fmt.Errorf("%v has no virtual memory management: %w", dev, err)
	}
	if err != nil {
		return err
	}
	weights, err := mr.Allocate(size, s)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, weights.Close()) }()
	kv, err := mr.AllocateTagged("kv", size/4, s)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, kv.Close()) }()
	want := make([]uint32, size/4)
	for i := range want {
		want[i] = value(i)
	}
	if err := buffer.CopyFromHost(weights, want, s); err != nil {
		return err
	}
	if err := s.Sync(); err != nil {
		return err
	}
	before := weights.Ptr()
	fmt.Printf("phase one holds %d MiB of weights and %d MiB of cache; %d MiB free\n", size>>20, size>>22, freeMiB())

	// Between the phases: the weights are kept, the cache is discarded.
	opts := &virtual.SleepOptions{Backup: virtual.BackupToHost}
	var file *os.File
	if backup == "file" {
		if file, err = os.CreateTemp("", "sleep-wake-*"); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, file.Close(), os.Remove(file.Name())) }()
		opts = &virtual.SleepOptions{Backup: virtual.BackupToWriter, Writer: file}
	}
	if err := mr.Sleep(opts, "weights"); err != nil {
		return err
	}
	if err := mr.Sleep(nil, "kv"); err != nil { // virtual.Discard
		return err
	}
	if err := weights.Fill8(0, s); !errors.Is(err, virtual.ErrAsleep) {
		return fmt.Errorf("a fill of sleeping memory gave %v, want an error matching virtual.ErrAsleep", err)
	}
	fmt.Printf("asleep (weights backed up to %s, cache discarded): %d MiB free\n", backup, freeMiB())

	// Phase two uses the memory freed.
	other, err := virtual.New(dev, &virtual.Options{HandleType: virtual.HandleNone})
	if err != nil {
		return err
	}
	work, err := other.Allocate(size, s)
	if err != nil {
		return fmt.Errorf("phase two allocating %d MiB: %w", size>>20, err)
	}
	if err := work.Fill32(7, s); err != nil {
		return errors.Join(err, work.Close())
	}
	fmt.Printf("phase two works in %d MiB: %d MiB free\n", size>>20, freeMiB())
	if err := work.Close(); err != nil {
		return err
	}

	// Phase one again, at the same addresses.
	wo := &virtual.WakeOptions{}
	if file != nil {
		if _, err := file.Seek(0, io.SeekStart); err != nil {
			return err
		}
		wo.Reader = file
	}
	if err := mr.Wake(wo); err != nil {
		return err
	}
	got := make([]uint32, len(want))
	if err := buffer.CopyToHost(got, weights, s); err != nil {
		return err
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("after wake, value %d is %#x, want %#x", i, got[i], want[i])
		}
	}
	if weights.Ptr() != before {
		return fmt.Errorf("the weights moved from %#x to %#x", uint64(before), uint64(weights.Ptr()))
	}
	var slept, woke string
	for _, st := range mr.SleepStats() {
		slept += fmt.Sprintf(" %s %v", st.Tag, st.LastSleep.Round(time.Microsecond))
		woke += fmt.Sprintf(" %s %v", st.Tag, st.LastWake.Round(time.Microsecond))
	}
	fmt.Printf("OK: %d MiB of weights woken at %#x with every value intact; %d MiB free (sleep:%s; wake:%s)\n", size>>20, uint64(before), freeMiB(), slept, woke)
	return nil
}
