package gpuprof_test

// CPU tests: a Tracking over a fake upstream that hands out made-up
// addresses (nothing reaches a driver); the profile written is parsed
// back with the pprof package and checked against what was allocated.

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/pprof/profile"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/resource"
	"github.com/cudamem/cudamem/resource/gpuprof"
)

// fakeMR hands out addresses from a counter, and out-of-memory past limit
// live bytes (0: no limit).
type fakeMR struct {
	mu    sync.Mutex
	next  uint64
	limit uint64
	live  map[cuda.DevicePtr]uint64
	bytes uint64
}

func newFake() *fakeMR { return &fakeMR{next: 1 << 40, live: map[cuda.DevicePtr]uint64{}} }

func (f *fakeMR) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.limit != 0 && f.bytes+size > f.limit {
		return 0, nil, &cuda.OpError{Op: "fake.Allocate", Err: fmt.Errorf("%d bytes: %w", size, cuda.ErrorOutOfMemory)}
	}
	p := cuda.DevicePtr(f.next)
	f.next += (size + 4095) &^ 4095
	f.live[p] = size
	f.bytes += size
	return p, s, nil
}

func (f *fakeMR) Deallocate(p cuda.DevicePtr, size uint64, _ *cuda.Stream) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.live, p)
	f.bytes -= size
	return nil
}
func (f *fakeMR) DeviceAccessible() bool { return true }
func (f *fakeMR) HostAccessible() bool   { return false }
func (f *fakeMR) DeviceID() int          { return 0 }

//go:noinline
func allocWeights(t *testing.T, mr *resource.Tracking, size uint64) *buffer.Buffer {
	b, err := mr.Allocate(size, nil)
	require.NoError(t, err)
	return b
}

//go:noinline
func allocScratch(t *testing.T, mr *resource.Tracking, size uint64) cuda.DevicePtr {
	p, _, err := mr.AllocatePtr(size, nil)
	require.NoError(t, err)
	return p
}

// sampleAt finds the one sample whose innermost frame is the function
// whose name ends with fn.
func sampleAt(t *testing.T, p *profile.Profile, fn string) *profile.Sample {
	t.Helper()
	var found *profile.Sample
	for _, s := range p.Sample {
		require.NotEmpty(t, s.Location)
		lines := s.Location[0].Line
		require.NotEmpty(t, lines)
		if strings.HasSuffix(lines[len(lines)-1].Function.Name, fn) || strings.HasSuffix(lines[0].Function.Name, fn) {
			require.Nil(t, found, "two samples at %s", fn)
			found = s
		}
	}
	require.NotNil(t, found, "no sample at %s in\n%v", fn, p)
	return found
}

func TestProfileStacksAndBytes(t *testing.T) {
	mr := resource.NewTracking(newFake(), &resource.TrackingOptions{CaptureStacks: true})
	var ws []*buffer.Buffer
	for range 3 {
		ws = append(ws, allocWeights(t, mr, 1000))
	}
	require.NoError(t, ws[0].Close()) // freed: in alloc_*, not in inuse_*
	p1 := allocScratch(t, mr, 5000)

	var buf bytes.Buffer
	require.NoError(t, gpuprof.WriteHeapProfile(&buf, mr))
	p, err := profile.Parse(&buf)
	require.NoError(t, err)
	require.NoError(t, p.CheckValid())

	var types []string
	for _, st := range p.SampleType {
		types = append(types, st.Type+"/"+st.Unit)
	}
	assert.Equal(t, []string{"inuse_objects/count", "inuse_space/bytes", "alloc_objects/count", "alloc_space/bytes"}, types)
	assert.Equal(t, "inuse_space", p.DefaultSampleType)
	require.Len(t, p.Sample, 2)

	w := sampleAt(t, p, "gpuprof_test.allocWeights")
	assert.Equal(t, []int64{2, 2000, 3, 3000}, w.Value)
	s := sampleAt(t, p, "gpuprof_test.allocScratch")
	assert.Equal(t, []int64{1, 5000, 1, 5000}, s.Value)

	// The stack goes on to the test that called the helper, and holds no
	// frame of package resource or buffer.Allocate.
	var names []string
	for _, loc := range w.Location {
		for _, l := range loc.Line {
			names = append(names, l.Function.Name)
		}
	}
	assert.Contains(t, names, "github.com/cudamem/cudamem/resource/gpuprof_test.TestProfileStacksAndBytes")
	for _, n := range names {
		assert.False(t, strings.HasPrefix(n, "github.com/cudamem/cudamem/resource."), n)
		assert.NotEqual(t, "github.com/cudamem/cudamem/buffer.Allocate", n)
	}

	for _, b := range ws[1:] {
		require.NoError(t, b.Close())
	}
	require.NoError(t, mr.Deallocate(p1, 5000, nil))
	pp, err := gpuprof.Profile(mr)
	require.NoError(t, err)
	var inuse, alloc int64
	for _, s := range pp.Sample {
		inuse += s.Value[1]
		alloc += s.Value[3]
	}
	assert.Zero(t, inuse)
	assert.Equal(t, int64(8000), alloc)
}

// Without stacks, one sample with no locations holds everything.
func TestProfileNoStacks(t *testing.T) {
	mr := resource.NewTracking(newFake(), nil)
	_ = allocScratch(t, mr, 10)
	_ = allocScratch(t, mr, 20)
	p, err := gpuprof.Profile(mr)
	require.NoError(t, err)
	require.Len(t, p.Sample, 1)
	assert.Empty(t, p.Sample[0].Location)
	assert.Equal(t, []int64{2, 30, 2, 30}, p.Sample[0].Value)
}

func TestProfileErrors(t *testing.T) {
	_, err := gpuprof.Profile(nil)
	assert.True(t, errors.Is(err, cuda.ErrInvalidArgument), "%v", err)
	assert.True(t, errors.Is(gpuprof.WriteHeapProfile(nil, resource.NewTracking(newFake(), nil)), cuda.ErrInvalidArgument))
	assert.True(t, errors.Is(gpuprof.WriteHeapProfile(&bytes.Buffer{}, nil), cuda.ErrInvalidArgument))
	assert.True(t, errors.Is(gpuprof.WriteFile("", nil), cuda.ErrInvalidArgument))
	err = gpuprof.WriteFile(filepath.Join(t.TempDir(), "no", "such", "dir", "p.pb.gz"), resource.NewTracking(newFake(), nil))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "gpuprof.WriteFile")
}

func TestHandler(t *testing.T) {
	mr := resource.NewTracking(newFake(), &resource.TrackingOptions{CaptureStacks: true})
	_ = allocScratch(t, mr, 4096)
	srv := httptest.NewServer(gpuprof.Handler(mr))
	defer srv.Close()

	res, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer res.Body.Close()
	assert.Equal(t, http.StatusOK, res.StatusCode)
	assert.Equal(t, "application/octet-stream", res.Header.Get("Content-Type"))
	assert.Contains(t, res.Header.Get("Content-Disposition"), "gpuheap.pb.gz")
	p, err := profile.Parse(res.Body)
	require.NoError(t, err)
	assert.Equal(t, []int64{1, 4096, 1, 4096}, sampleAt(t, p, "allocScratch").Value)

	res2, err := http.Get(srv.URL + "?debug=1")
	require.NoError(t, err)
	defer res2.Body.Close()
	var text bytes.Buffer
	_, err = text.ReadFrom(res2.Body)
	require.NoError(t, err)
	assert.Contains(t, res2.Header.Get("Content-Type"), "text/plain")
	assert.Contains(t, text.String(), "1 live allocations, 4096 bytes")
	assert.Contains(t, text.String(), "allocScratch")

	res3, err := http.Get(srv.URL + "?debug=x")
	require.NoError(t, err)
	res3.Body.Close()
	assert.Equal(t, http.StatusBadRequest, res3.StatusCode)

	rec := httptest.NewRecorder()
	gpuprof.Handler(nil).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	assert.Equal(t, http.StatusInternalServerError, rec.Code)
}

// The hook writes the profile when an allocation finally fails, with what
// filled the memory in it.
func TestWriteOnOutOfMemory(t *testing.T) {
	name := filepath.Join(t.TempDir(), "oom.pb.gz")
	up := newFake()
	up.limit = 10000
	var reported []error
	mr := resource.NewTracking(up, &resource.TrackingOptions{
		CaptureStacks: true,
		OnOutOfMemory: gpuprof.WriteOnOutOfMemory(name, func(err error) { reported = append(reported, err) }),
	})
	w := allocWeights(t, mr, 8000)
	_, err := mr.Allocate(4000, nil)
	require.True(t, errors.Is(err, cuda.ErrorOutOfMemory), "%v", err)
	assert.Empty(t, reported)

	f, err := os.Open(name)
	require.NoError(t, err)
	defer f.Close()
	p, err := profile.Parse(f)
	require.NoError(t, err)
	assert.Equal(t, []int64{1, 8000, 1, 8000}, sampleAt(t, p, "allocWeights").Value)
	require.NoError(t, w.Close())

	// A file that cannot be written is reported, and the allocation's
	// error is still the out-of-memory one.
	bad := resource.NewTracking(up, &resource.TrackingOptions{
		OnOutOfMemory: gpuprof.WriteOnOutOfMemory(filepath.Join(name, "not-a-dir", "x"), func(err error) { reported = append(reported, err) }),
	})
	_, err = bad.Allocate(1<<40, nil)
	require.True(t, errors.Is(err, cuda.ErrorOutOfMemory), "%v", err)
	require.Len(t, reported, 1)
	assert.Contains(t, reported[0].Error(), "gpuprof.WriteFile")
}

// The profile opens in the go command's own pprof, as a user opens it:
// its top lists each allocation site with its bytes.
func TestProfileOpensInGoToolPprof(t *testing.T) {
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH:", err)
	}
	mr := resource.NewTracking(newFake(), &resource.TrackingOptions{CaptureStacks: true})
	w := allocWeights(t, mr, 3<<20)
	s := allocScratch(t, mr, 5<<20)
	file := filepath.Join(t.TempDir(), "gpu.pb.gz")
	require.NoError(t, gpuprof.WriteFile(file, mr))

	out, err := exec.Command(goCmd, "tool", "pprof", "-top", "-sample_index=inuse_space", file).CombinedOutput()
	require.NoError(t, err, "%s", out)
	top := string(out)
	assert.Contains(t, top, "Type: inuse_space")
	assert.Regexp(t, `(?m)^\s+3MB .*gpuprof_test\.allocWeights$`, top)
	assert.Regexp(t, `(?m)^\s+5MB .*gpuprof_test\.allocScratch$`, top)

	require.NoError(t, w.Close())
	require.NoError(t, mr.Deallocate(s, 5<<20, nil))
}

//go:noinline
func allocKept(mr *resource.Tracking, size uint64) (cuda.DevicePtr, error) {
	p, _, err := mr.AllocatePtr(size, nil)
	return p, err
}

//go:noinline
func allocChurn(mr *resource.Tracking, size uint64) (cuda.DevicePtr, error) {
	p, _, err := mr.AllocatePtr(size, nil)
	return p, err
}

// A profile is one snapshot: taken while goroutines allocate (and free),
// no sample shows more in use than was ever allocated at its site, in
// objects or bytes, and the live set of every profile is within the
// totals. Read under two locks, the totals and the live set let through
// allocations made between them: a site that frees nothing then showed
// more in use than allocated.
func TestProfileIsOneSnapshot(t *testing.T) {
	mr := resource.NewTracking(newFake(), &resource.TrackingOptions{CaptureStacks: true})
	const workers, perWorker = 4, 20000
	var (
		wg    sync.WaitGroup
		start sync.WaitGroup
		mu    sync.Mutex
		kept  []keptAlloc
	)
	start.Add(workers)
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []keptAlloc
			defer func() {
				mu.Lock()
				kept = append(kept, mine...)
				mu.Unlock()
			}()
			start.Done()
			for i := range perWorker {
				if g%2 == 0 {
					// Never freed while profiles are taken: in use equals
					// allocated at this site, so that any allocation a
					// profile counts live but not in the totals shows.
					size := uint64(1 + i%512)
					p, err := allocKept(mr, size)
					if !assert.NoError(t, err) {
						return
					}
					mine = append(mine, keptAlloc{p, size})
					continue
				}
				p, err := allocChurn(mr, 4096)
				if !assert.NoError(t, err) {
					return
				}
				if i%2 == 1 {
					if !assert.NoError(t, mr.Deallocate(p, 4096, nil)) {
						return
					}
				} else {
					mine = append(mine, keptAlloc{p, 4096})
				}
			}
		}()
	}

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	start.Wait()
	bad, profiles := 0, 0
	for running := true; running || profiles == 0; profiles++ {
		select {
		case <-done:
			running = false
		default:
		}
		n := profiles
		p, err := gpuprof.Profile(mr)
		require.NoError(t, err)
		var inuse, alloc [2]int64
		for _, s := range p.Sample {
			if s.Value[0] > s.Value[2] || s.Value[1] > s.Value[3] {
				if bad++; bad <= 5 {
					t.Errorf("profile %d: in use %d objects, %d bytes; allocated %d, %d bytes", n, s.Value[0], s.Value[1], s.Value[2], s.Value[3])
				}
			}
			inuse[0], inuse[1] = inuse[0]+s.Value[0], inuse[1]+s.Value[1]
			alloc[0], alloc[1] = alloc[0]+s.Value[2], alloc[1]+s.Value[3]
		}
		assert.LessOrEqual(t, inuse[0], alloc[0], "profile %d: objects in use within those allocated", n)
		assert.LessOrEqual(t, inuse[1], alloc[1], "profile %d: bytes in use within those allocated", n)
	}
	assert.Zero(t, bad, "samples with more in use than allocated, in %d profiles", profiles)

	t.Logf("%d profiles, %d allocations live at the end", profiles, mr.LiveCount())
	for _, a := range kept {
		require.NoError(t, mr.Deallocate(a.p, a.size, nil))
	}
	assert.Zero(t, mr.LiveCount())
}

type keptAlloc struct {
	p    cuda.DevicePtr
	size uint64
}

// oomOnce fails its first allocation with out-of-memory, as a full device
// does, and forwards the rest to a fake.
type oomOnce struct {
	*fakeMR
	failed bool
}

func (o *oomOnce) AllocatePtr(size uint64, s *cuda.Stream) (cuda.DevicePtr, *cuda.Stream, error) {
	if !o.failed {
		o.failed = true
		return 0, nil, &cuda.OpError{Op: "oomOnce.Allocate", Err: cuda.ErrorOutOfMemory}
	}
	return o.fakeMR.AllocatePtr(size, s)
}

//go:noinline
func allocThroughRetrying(t *testing.T, r *resource.Retrying) *buffer.Buffer {
	b, err := r.Allocate(1<<20, nil)
	require.NoError(t, err)
	return b
}

// Only the frames of cudamem at the top of a stack are left out: an
// allocation made inside a Retrying's callback keeps the frames of the
// Retrying (and of buffer.Allocate) below the callback, which are where it
// was made from; those frames were dropped wherever they were.
func TestProfileKeepsCudamemFramesBelowTheTop(t *testing.T) {
	mr := resource.NewTracking(newFake(), &resource.TrackingOptions{CaptureStacks: true})
	var inCallback *buffer.Buffer
	retry := resource.NewRetrying(&oomOnce{fakeMR: newFake()}, func(size uint64, attempt int) bool {
		inCallback = allocWeights(t, mr, 4096) // as a callback that takes memory for a cache would
		return attempt == 1
	})
	outer := allocThroughRetrying(t, retry)
	require.NotNil(t, inCallback)

	p, err := gpuprof.Profile(mr)
	require.NoError(t, err)
	require.Len(t, p.Sample, 1)
	s := p.Sample[0]
	assert.Equal(t, []int64{1, 4096, 1, 4096}, s.Value)
	var names []string
	for _, loc := range s.Location {
		for _, l := range loc.Line {
			names = append(names, l.Function.Name)
		}
	}
	require.NotEmpty(t, names)
	assert.Equal(t, "github.com/cudamem/cudamem/resource/gpuprof_test.allocWeights", names[0], "the top frames of package resource and buffer.Allocate are left out: %q", names)
	assert.Contains(t, names, "github.com/cudamem/cudamem/resource.(*Retrying).AllocatePtr", "the Retrying that called the callback: %q", names)
	assert.Contains(t, names, "github.com/cudamem/cudamem/buffer.Allocate", "below the Retrying: %q", names)
	assert.Contains(t, names, "github.com/cudamem/cudamem/resource/gpuprof_test.allocThroughRetrying", names)
	assert.Contains(t, names, "github.com/cudamem/cudamem/resource/gpuprof_test.TestProfileKeepsCudamemFramesBelowTheTop", names)

	require.NoError(t, inCallback.Close())
	require.NoError(t, outer.Close())
}
