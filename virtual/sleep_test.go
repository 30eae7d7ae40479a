package virtual

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"testing/iotest"

	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/asleep"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/resource/timeline"
)

// sleepers allocates, on a fake driver, one buffer of tag "kv" spanning
// two chunks (grown), one of tag "weights" and one of tag "scratch", and
// writes a distinct pattern into each.
func sleepers(t *testing.T, o *Options) (*Resource, *fakeDriver, []*buffer.Buffer) {
	t.Helper()
	r, f := newFakeResource(t, testGran, o)
	// Addresses of their own: the ranges asleep are process-wide.
	f.next = fakeBase + sleepBase.Add(1)<<40
	kv, err := r.AllocateTagged("kv", testGran+100, nil)
	if err != nil {
		t.Fatal(err)
	}
	if kv, err = r.Grow(kv, 2*testGran+100); err != nil {
		t.Fatal(err)
	}
	w, err := r.AllocateTagged("weights", 3*testGran, nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.AllocateTagged("scratch", 100, nil)
	if err != nil {
		t.Fatal(err)
	}
	bufs := []*buffer.Buffer{kv, w, s}
	for i, b := range bufs {
		if err := f.write(b.Ptr(), pattern(i, b.Size())); err != nil {
			t.Fatal(err)
		}
	}
	return r, f, bufs
}

var sleepBase atomic.Uint64

func pattern(seed int, n uint64) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(uint64(i)*7 + uint64(seed)*31 + 1)
	}
	return b
}

// requireData fails t unless each buffer of bufs[i] for i in which holds
// its pattern.
func requireData(t *testing.T, f *fakeDriver, bufs []*buffer.Buffer, which ...int) {
	t.Helper()
	for _, i := range which {
		got, err := f.read(bufs[i].Ptr(), bufs[i].Size())
		if err != nil {
			t.Fatalf("buffer %d: %v", i, err)
		}
		if !bytes.Equal(got, pattern(i, bufs[i].Size())) {
			t.Fatalf("buffer %d: contents differ from what was written", i)
		}
	}
}

// requireAsleep fails t unless each of bufs[i] is refused with its tag
// (asleep) or usable (awake), and its memory is unmapped or mapped.
func requireAsleep(t *testing.T, f *fakeDriver, bufs []*buffer.Buffer, want bool, which ...int) {
	t.Helper()
	for _, i := range which {
		b := bufs[i]
		err := b.Use("test", func(cuda.DevicePtr) error { return nil })
		_, mapped := f.maps[b.Ptr()]
		if want {
			var ae *AsleepError
			if !errors.Is(err, ErrAsleep) || !errors.As(err, &ae) || ae.Addr != b.Ptr() {
				t.Fatalf("buffer %d: Use while asleep = %v, want an *AsleepError for %#x", i, err, uint64(b.Ptr()))
			}
			if mapped {
				t.Fatalf("buffer %d: asleep but still mapped", i)
			}
		} else {
			if err != nil {
				t.Fatalf("buffer %d: Use while awake: %v", i, err)
			}
			if !mapped {
				t.Fatalf("buffer %d: awake but not mapped", i)
			}
		}
	}
}

func TestSleepWakeRoundTrip(t *testing.T) {
	for _, mode := range []Backup{BackupToHost, BackupToWriter, Discard} {
		t.Run(mode.String(), func(t *testing.T) {
			r, f, bufs := sleepers(t, nil)
			var stream bytes.Buffer
			so := &SleepOptions{Backup: mode}
			if mode == BackupToWriter {
				so.Writer = &stream
			}
			resv := len(f.resv)
			handles := len(f.handles)
			if err := r.Sleep(so, "kv", "weights"); err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, r, f)
			requireAsleep(t, f, bufs, true, 0, 1)
			requireAsleep(t, f, bufs, false, 2)
			requireData(t, f, bufs, 2)
			if len(f.resv) != resv {
				t.Fatalf("%d reservations after sleep, %d before: the addresses must stay reserved", len(f.resv), resv)
			}
			if len(f.handles) != handles-3 { // kv's two chunks, weights' one
				t.Fatalf("%d handles after sleep, %d before: 3 must be released", len(f.handles), handles)
			}
			var ae *AsleepError
			err := bufs[1].Use("test", func(cuda.DevicePtr) error { return nil })
			if !errors.As(err, &ae) || ae.Tag != "weights" {
				t.Fatalf("Use of the weights = %v, want the tag named", err)
			}
			st := r.SleepStats()
			if len(st) != 2 || st[0].Tag != "kv" || st[0].Asleep != 3*testGran || st[0].Allocations != 1 || st[1].Asleep != 3*testGran || st[0].Sleeps != 1 {
				t.Fatalf("stats after sleep: %+v", st)
			}
			if got := st[0].Backup; (mode == Discard) != (got == 0) {
				t.Fatalf("backup bytes %d with %v", got, mode)
			}
			// A second Sleep of the same tags has nothing to do.
			if err := r.Sleep(nil, "kv"); err != nil {
				t.Fatal(err)
			}
			wo := &WakeOptions{}
			if mode == BackupToWriter {
				wo.Reader = &stream
			}
			if err := r.Wake(wo, "kv", "weights"); err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, r, f)
			requireAsleep(t, f, bufs, false, 0, 1, 2)
			if mode != Discard {
				requireData(t, f, bufs, 0, 1, 2)
			}
			st = r.SleepStats()
			if st[0].Asleep != 0 || st[0].Wakes != 1 || st[0].WokeBytes != 3*testGran || st[1].Backup != 0 {
				t.Fatalf("stats after wake: %+v", st)
			}
			if asleep.Any() {
				t.Fatal("ranges still registered asleep after wake")
			}
			closeAll(t, r, f, bufs...)
		})
	}
}

// TestSleepAllTagsAndKeepHostBackup sleeps every tag (no tags named),
// keeps the pinned backup across a wake, and checks the second sleep
// reuses it (no new pinned allocation) and DropHostBackup frees it.
func TestSleepAllTagsAndKeepHostBackup(t *testing.T) {
	r, f, bufs := sleepers(t, nil)
	for round := range 2 {
		if err := r.Sleep(&SleepOptions{Backup: BackupToHost}); err != nil {
			t.Fatal(err)
		}
		requireAsleep(t, f, bufs, true, 0, 1, 2)
		if len(f.hosts) != 1 {
			t.Fatalf("round %d: %d pinned allocations, want the one backup", round, len(f.hosts))
		}
		if err := r.Wake(&WakeOptions{KeepHostBackup: true}); err != nil {
			t.Fatal(err)
		}
		requireData(t, f, bufs, 0, 1, 2)
		if len(f.hosts) != 1 {
			t.Fatalf("round %d: %d pinned allocations after a wake that keeps the backup", round, len(f.hosts))
		}
	}
	if err := r.DropHostBackup(); err != nil {
		t.Fatal(err)
	}
	closeAll(t, r, f, bufs...)
}

func TestCloseWhileAsleep(t *testing.T) {
	r, f, bufs := sleepers(t, nil)
	if err := r.Sleep(&SleepOptions{Backup: BackupToHost}, "kv", "weights"); err != nil {
		t.Fatal(err)
	}
	if err := bufs[0].Close(); err != nil {
		t.Fatal(err)
	}
	// The address range is free again: a new allocation there is usable.
	if asleep.Check(uint64(bufs[0].Ptr()), 1) != nil {
		t.Fatal("a closed allocation's range still refuses uses")
	}
	if err := r.Wake(nil, "kv", "weights"); err != nil {
		t.Fatal(err)
	}
	requireData(t, f, bufs, 1, 2)
	closeAll(t, r, f, bufs[1:]...)
}

func TestSleepRefusals(t *testing.T) {
	r, f, bufs := sleepers(t, nil)
	before := snapshot(r, f)
	for _, c := range []struct {
		name string
		o    *SleepOptions
		tags []string
	}{
		{"writer without Writer", &SleepOptions{Backup: BackupToWriter}, nil},
		{"Writer without BackupToWriter", &SleepOptions{Writer: &bytes.Buffer{}}, nil},
		{"unknown backup", &SleepOptions{Backup: 9}, nil},
	} {
		err := r.Sleep(c.o, c.tags...)
		if !errors.Is(err, cuda.ErrInvalidArgument) {
			t.Fatalf("%s: Sleep = %v, want ErrInvalidArgument", c.name, err)
		}
		if got := snapshot(r, f); got != before {
			t.Fatalf("%s: a refused Sleep changed things:\n%s\nwas\n%s", c.name, got, before)
		}
	}
	// A Wake of writer-backed memory without a reader leaves it asleep.
	var stream bytes.Buffer
	if err := r.Sleep(&SleepOptions{Backup: BackupToWriter, Writer: &stream}, "kv"); err != nil {
		t.Fatal(err)
	}
	if err := r.Wake(nil, "kv"); !errors.Is(err, cuda.ErrInvalidArgument) {
		t.Fatalf("Wake without a Reader = %v", err)
	}
	requireAsleep(t, f, bufs, true, 0)
	// A corrupt stream, then a truncated one, then the stream of another
	// resource's Sleep: each leaves it asleep; the true one wakes it.
	good := stream.Bytes()
	bad := bytes.Clone(good)
	bad[len(bad)/2] ^= 1
	for name, b := range map[string][]byte{"corrupt": bad, "truncated": good[:len(good)-30], "empty": nil, "foreign": []byte("not a backup stream at all")} {
		err := r.Wake(&WakeOptions{Reader: bytes.NewReader(b)}, "kv")
		if !errors.Is(err, cuda.ErrInvalidArgument) || !strings.Contains(err.Error(), "Resource.Wake") {
			t.Fatalf("Wake from a %s stream = %v, want an invalid argument naming Resource.Wake", name, err)
		}
		if ended := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF); ended != (name == "truncated" || name == "empty") {
			t.Fatalf("Wake from a %s stream = %v: the reader's end of stream kept %v", name, err, ended)
		}
		checkInvariants(t, r, f)
		requireAsleep(t, f, bufs, true, 0)
	}
	// A reader that fails is the reader's error, not a malformed stream.
	broken := errors.New("connection reset")
	err := r.Wake(&WakeOptions{Reader: io.MultiReader(bytes.NewReader(good[:100]), iotest.ErrReader(broken))}, "kv")
	if !errors.Is(err, broken) || errors.Is(err, cuda.ErrInvalidArgument) {
		t.Fatalf("Wake from a failing reader = %v, want its error and no invalid argument", err)
	}
	checkInvariants(t, r, f)
	requireAsleep(t, f, bufs, true, 0)
	if err := r.Wake(&WakeOptions{Reader: bytes.NewReader(good)}, "kv"); err != nil {
		t.Fatal(err)
	}
	requireData(t, f, bufs, 0)
	closeAll(t, r, f, bufs...)
}

func TestSleepHooks(t *testing.T) {
	var log []string
	failOn := ""
	hooks := &resource.SegmentHooks{
		Acquired: func(p cuda.DevicePtr, n uint64) error {
			log = append(log, fmt.Sprintf("acquired %#x+%d", uint64(p), n))
			if failOn == "acquired" {
				panic("hook panics")
			}
			return nil
		},
		Released: func(p cuda.DevicePtr, n uint64) error {
			log = append(log, fmt.Sprintf("released %#x+%d", uint64(p), n))
			if failOn == "released" && len(log) == 2 {
				return errors.New("hook refuses")
			}
			return nil
		},
	}
	r, f, bufs := sleepers(t, &Options{HandleType: HandleNone, Segments: hooks})
	// The second Released fails: the first is undone, all stays awake.
	failOn = "released"
	if err := r.Sleep(&SleepOptions{Backup: BackupToHost}, "kv", "weights"); err == nil {
		t.Fatal("Sleep with a failing hook succeeded")
	}
	want := []string{
		fmt.Sprintf("released %#x+%d", uint64(bufs[0].Ptr()), 3*testGran),
		fmt.Sprintf("released %#x+%d", uint64(bufs[1].Ptr()), 3*testGran),
		fmt.Sprintf("acquired %#x+%d", uint64(bufs[0].Ptr()), 3*testGran),
	}
	if fmt.Sprint(log) != fmt.Sprint(want) {
		t.Fatalf("hooks ran %q, want %q", log, want)
	}
	requireAsleep(t, f, bufs, false, 0, 1, 2)
	checkInvariants(t, r, f)
	failOn, log = "", nil
	if err := r.Sleep(&SleepOptions{Backup: BackupToHost}, "kv", "weights"); err != nil {
		t.Fatal(err)
	}
	// An Acquired that panics: the wake is undone (Released for the ones
	// acquired: none), all stays asleep with its backup.
	failOn, log = "acquired", nil
	if err := r.Wake(nil); err == nil {
		t.Fatal("Wake with a panicking hook succeeded")
	}
	requireAsleep(t, f, bufs, true, 0, 1)
	checkInvariants(t, r, f)
	failOn = ""
	if err := r.Wake(nil); err != nil {
		t.Fatal(err)
	}
	requireData(t, f, bufs, 0, 1, 2)
	closeAll(t, r, f, bufs...)
}

// TestSleepFaultSweep fails each driver call of a Sleep in turn (once,
// and from then on), then each of a Wake's, and requires every time that
// the memory ends either fully awake with its contents or fully asleep
// with its backup, that a healthy Wake then brings every byte back, and
// that nothing leaks.
func TestSleepFaultSweep(t *testing.T) {
	for _, mode := range []Backup{BackupToHost, BackupToWriter, Discard} {
		for _, sticky := range []bool{false, true} {
			for _, phase := range []string{"sleep", "wake"} {
				t.Run(fmt.Sprintf("%v/%s/sticky=%v", mode, phase, sticky), func(t *testing.T) {
					for k := 1; ; k++ {
						if !sweepSleepStep(t, mode, phase, k, sticky) {
							if k < 3 {
								t.Fatalf("only %d steps", k)
							}
							return
						}
					}
				})
			}
		}
	}
}

// sweepSleepStep runs one step of TestSleepFaultSweep and reports whether
// the k-th call was reached (false once the operation made fewer calls).
func sweepSleepStep(t *testing.T, mode Backup, phase string, k int, sticky bool) bool {
	t.Helper()
	r, f, bufs := sleepers(t, nil)
	var stream bytes.Buffer
	so := &SleepOptions{Backup: mode}
	if mode == BackupToWriter {
		so.Writer = &stream
	}
	wake := func() error {
		wo := &WakeOptions{}
		if mode == BackupToWriter {
			wo.Reader = bytes.NewReader(stream.Bytes())
		}
		return r.Wake(wo, "kv", "weights")
	}
	if phase == "wake" {
		if err := r.Sleep(so, "kv", "weights"); err != nil {
			t.Fatal(err)
		}
	}
	f.failAt(k, sticky)
	var err error
	if phase == "sleep" {
		err = r.Sleep(so, "kv", "weights")
	} else {
		err = wake()
	}
	reached := f.failed > 0
	f.heal()
	checkInvariants(t, r, f)
	// What a failed cleanup left (a mapping in a sleeping range, say) is
	// given back by the next call; let it go before looking.
	if err := r.Reclaim(); err != nil {
		t.Fatalf("step %d: Reclaim: %v", k, err)
	}
	r.mu.Lock()
	sleeping := r.allocs[bufs[0].Ptr()].sleep != nil
	both := sleeping == (r.allocs[bufs[1].Ptr()].sleep != nil)
	r.mu.Unlock()
	if !both {
		t.Fatalf("step %d: one allocation asleep, the other awake (err %v)", k, err)
	}
	if reached && err == nil && !sleeping == (phase == "sleep") {
		t.Fatalf("step %d: %s failed a call but reported success without taking effect", k, phase)
	}
	if !sleeping && (phase == "wake" || err != nil) {
		// Awake: every byte as it was (unless discarded and woken).
		requireAsleep(t, f, bufs, false, 0, 1)
		if mode != Discard || phase == "sleep" {
			requireData(t, f, bufs, 0, 1, 2)
		}
	}
	if sleeping {
		requireAsleep(t, f, bufs, true, 0, 1)
		if err := wake(); err != nil {
			t.Fatalf("step %d: healthy Wake after a failed %s: %v", k, phase, err)
		}
		if mode != Discard {
			requireData(t, f, bufs, 0, 1, 2)
		}
	}
	requireData(t, f, bufs, 2)
	closeAll(t, r, f, bufs...)
	if asleep.Any() {
		t.Fatalf("step %d: ranges left registered asleep", k)
	}
	return reached
}

// TestSleepTimeline records a sleep and a wake of two tags in a timeline:
// one event per allocation, with its tag, size and the call's time, in
// order, and a span each in the Chrome trace.
func TestSleepTimeline(t *testing.T) {
	log := timeline.NewLog(0)
	r, f, bufs := sleepers(t, &Options{HandleType: HandleNone, Timeline: log})
	if err := r.Sleep(&SleepOptions{Backup: BackupToHost}, "kv", "weights"); err != nil {
		t.Fatal(err)
	}
	if err := r.Wake(nil, "weights"); err != nil {
		t.Fatal(err)
	}
	tr := log.Trace()
	var got []string
	for _, e := range tr.Events {
		if e.Duration <= 0 || e.Resource != "virtual" {
			t.Fatalf("event %+v: want the call's time and resource \"virtual\"", e)
		}
		got = append(got, fmt.Sprintf("%v %s %#x %d", e.Kind, e.Tag, e.Addr, e.Size))
	}
	want := []string{
		fmt.Sprintf("sleep kv %#x %d", uint64(bufs[0].Ptr()), 3*testGran),
		fmt.Sprintf("sleep weights %#x %d", uint64(bufs[1].Ptr()), 3*testGran),
		fmt.Sprintf("wake weights %#x %d", uint64(bufs[1].Ptr()), 3*testGran),
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("events %q, want %q", got, want)
	}
	var chrome bytes.Buffer
	if err := tr.WriteChromeTrace(&chrome); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(chrome.String(), `"cat":"sleep"`); n != 2 {
		t.Fatalf("%d sleep spans in the Chrome trace, want 2:\n%s", n, chrome.String())
	}
	if err := r.Wake(nil); err != nil {
		t.Fatal(err)
	}
	closeAll(t, r, f, bufs...)
}

// A Sleep whose unmap fails leaves the mapping to r's leftovers; closing
// the sleeping buffer then retries them before it frees the address
// space, so the range is freed with nothing mapped in it.
func TestCloseAsleepRetriesLeftovers(t *testing.T) {
	r, f, bufs := sleepers(t, nil)
	f.failCall("cuMemUnmap", 1, true) // the whole range's unmap, and the chunks' after it
	err := r.Sleep(nil, "scratch")
	f.heal()
	checkInvariants(t, r, f)
	r.left.mu.Lock()
	left := len(r.left.l.maps)
	r.left.mu.Unlock()
	if left == 0 {
		t.Fatalf("the failed unmaps left no mapping behind (Sleep: %v)", err)
	}
	// Sleep is past its point of no return: asleep, the rest kept for a
	// retry, and said so.
	require.ErrorContains(t, err, "kept for a retry")
	if err := bufs[2].Close(); err != nil {
		t.Fatalf("closing the sleeping buffer: %v", err)
	}
	checkInvariants(t, r, f)
	r.left.mu.Lock()
	l := r.left.l
	r.left.mu.Unlock()
	if len(l.maps) != 0 || len(l.spans) != 0 {
		t.Fatalf("left after the close: %+v", l)
	}
	closeAll(t, r, f, bufs[:2]...)
}
