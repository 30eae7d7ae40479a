//go:build cudamemfault

package faultsweep

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/faultinject"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/internal/testkit/testutil"
)

// injected is the CUresult every swept call fails with. Out of memory is
// what real drivers return most and what no cudamem code treats as
// anything but a failure.
const injected = cuda.ErrorOutOfMemory

// poolOOMRetry is why an allocation from a pool absorbs one failure: the
// injected failure is out-of-memory, which DevicePool and PinnedPool
// answer by trimming the pool and retrying once (the retry is the next
// driver call, which is not failed).
const poolOOMRetry = "a pool's out-of-memory is retried once after trimming"

// opTimeout bounds one run of an operation: beyond it the sweep reports a
// deadlock and stops (the process state can no longer be trusted).
const opTimeout = 30 * time.Second

// fixture is one operation under test, with the objects it works on.
type fixture struct {
	// op is the operation under test; it runs with one driver call failing.
	op func() error
	// verify, run unarmed after op (failed or not), proves the objects
	// still work: typically the operation again, checking the data.
	verify func() error
	// cleanup, run unarmed last, releases what op made and the fixture.
	cleanup func() error
	// state, if set, describes what op must leave unchanged when it fails
	// (pool usage, adaptor counters): read before op and after a failed op.
	state func() string
}

// sweepCase is one public operation.
type sweepCase struct {
	name string
	// devices is how many devices the case needs (0 means 1).
	devices int
	// setup builds the fixture, unarmed.
	setup func() (*fixture, error)
	// absorbed lists entry points whose injected failure the operation may
	// legitimately absorb (succeed anyway), with the reason.
	absorbed map[string]string
	// gpuSkip, when set, is why the case cannot run on a real driver.
	gpuSkip string
	// driverKeeps, when set, says why a real driver's free device memory
	// may fall with every run of the case, the unarmed one included: the
	// drop is logged instead of reported (every other counter is still
	// checked).
	driverKeeps string
}

// debugSweep logs the counters after every run (FAULTSWEEP_DEBUG=1).
var debugSweep = os.Getenv("FAULTSWEEP_DEBUG") == "1"

// queryPointerAbsorbed: cuda.QueryPointer reads the memory's pool last and
// ignores a failure there (memory not from a pool has none to report).
var queryPointerAbsorbed = map[string]string{"cuPointerGetAttribute": "QueryPointer reads the pool handle best-effort"}

// counters is everything that must be back to its baseline after each run.
type counters struct {
	fake  fakecuda.Snapshot
	fds   int
	leaks int64
	free  []uint64 // real driver: free device memory per device
}

func (c counters) diff(base counters) string {
	var out string
	if fake != nil {
		out += c.fake.Diff(base.fake)
	}
	// Fewer fds is no leak: the GC may close an *os.File some earlier
	// test dropped while this one runs.
	if c.fds > base.fds {
		out += fmt.Sprintf("open fds %d -> %d; ", base.fds, c.fds)
	}
	if c.leaks != base.leaks {
		out += fmt.Sprintf("buffer.Leaks %d -> %d; ", base.leaks, c.leaks)
	}
	for i := range c.free {
		// More free memory is no leak: the driver gives memory back
		// lazily (managed memory, pools over their release threshold).
		if i < len(base.free) && c.free[i] < base.free[i] {
			out += fmt.Sprintf("GPU %d free memory %d -> %d; ", i, base.free[i], c.free[i])
		}
	}
	return out
}

func snap() counters {
	c := counters{fds: len(testutil.OpenFDs()), leaks: buffer.Leaks()}
	if fake != nil {
		c.fake = fake.Snapshot()
		return c
	}
	devs, _ := cuda.Devices()
	for _, d := range devs {
		// Memory a pool keeps after frees is not in use: give it back
		// first so cuMemGetInfo counts only live allocations.
		if p, err := d.CurrentMemPool(); err == nil {
			_ = p.TrimTo(0) // best effort: a failure shows as a difference below
		}
		_ = d.Sync()
		free, _, _ := d.MemInfo()
		c.free = append(c.free, free)
	}
	return c
}

// guard runs f, turning a panic into an error (with the stack) and a hang
// into a fatal test failure.
func guard(t *testing.T, what string, f func() error) (err error, panicked bool) {
	type res struct {
		err      error
		panicked bool
	}
	ch := make(chan res, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				ch <- res{fmt.Errorf("panic: %v\n%s", r, debug.Stack()), true}
			}
		}()
		ch <- res{f(), false}
	}()
	select {
	case r := <-ch:
		return r.err, r.panicked
	case <-time.After(opTimeout):
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		problem(what + ": deadlock")
		t.Fatalf("%s: no return after %v (deadlock?)\n%s", what, opTimeout, buf)
		return nil, false
	}
}

func needDevices(t *testing.T, n int) {
	t.Helper()
	have, err := cuda.DeviceCount()
	if err != nil {
		if os.Getenv("CUDAMEM_REQUIRE_GPU") == "1" {
			t.Fatalf("no driver: %v", err)
		}
		t.Skipf("no driver: %v", err)
	}
	if have < n {
		t.Skipf("needs %d devices, have %d", n, have)
	}
}

// sweep runs c once unarmed to learn how many driver calls it makes, then
// once with each of those calls failing, checking everything after each.
func sweep(t *testing.T, c sweepCase) {
	needDevices(t, max(c.devices, 1))
	if fake == nil && c.gpuSkip != "" {
		t.Skip(c.gpuSkip)
	}
	_, _, err := cuda.Driver() // load and resolve the driver before counting calls
	if err != nil {
		t.Fatal(err)
	}

	// Warm-up: lazy, process-wide state (primary contexts, the staging
	// pool, the driver's own descriptors) is made here, before the baseline.
	f, err := c.setup()
	if err != nil {
		if errors.Is(err, cuda.ErrNotSupported) {
			t.Skipf("%s: %v", c.name, err)
		}
		t.Fatalf("%s setup: %v", c.name, err)
	}
	faultinject.Reset()
	err, _ = guard(t, c.name+" warm-up", f.op)
	n := faultinject.Calls()
	if err != nil {
		_, _ = guard(t, c.name+" cleanup", f.cleanup)
		if errors.Is(err, cuda.ErrNotSupported) {
			t.Skipf("%s: %v", c.name, err)
		}
		t.Fatalf("%s fails without injection: %v", c.name, err)
	}
	if f.verify != nil {
		if err, _ := guard(t, c.name+" verify", f.verify); err != nil {
			_, _ = guard(t, c.name+" cleanup", f.cleanup) // the failure is reported; don't leak into later cases
			t.Fatalf("%s: verify fails without injection: %v", c.name, err)
		}
	}
	if err, _ := guard(t, c.name+" cleanup", f.cleanup); err != nil {
		t.Fatalf("%s: cleanup fails without injection: %v", c.name, err)
	}
	if n == 0 {
		t.Logf("%s makes no driver calls: nothing to sweep", c.name)
		return
	}
	base := snap()

	report := func(k int64, failed, format string, args ...any) {
		msg := fmt.Sprintf("%s k=%d/%d (%s failed): ", c.name, k, n, failed) + fmt.Sprintf(format, args...)
		problem(msg)
		t.Error(msg)
	}
	pairs := 0
	// k = 0 runs the operation once more unarmed: a leak on the success
	// path would otherwise hide in the baseline taken after the warm-up.
	for k := int64(0); k <= n; k++ {
		f, err := c.setup()
		if err != nil {
			t.Fatalf("%s setup (unarmed) before k=%d: %v", c.name, k, err)
		}
		var before string
		if f.state != nil {
			before = f.state()
		}
		faultinject.FailCall(k, int32(injected)) // k = 0 disarms
		opErr, panicked := guard(t, c.name, f.op)
		fired, addr := faultinject.Fired()
		faultinject.Reset()
		failed := faultinject.ProcName(addr)
		switch {
		case panicked:
			report(k, failed, "panic: %v", opErr)
		case fired == 0:
			// This run made fewer calls than the first: nothing was failed.
			if opErr != nil {
				report(k, "nothing", "failed without an injected fault: %v", opErr)
			}
		case opErr == nil:
			if why, ok := c.absorbed[failed]; ok {
				t.Logf("k=%d: %s failure absorbed: %s", k, failed, why)
			} else if failed == "cuMemAllocFromPoolAsync" {
				// Every pool answers the injected out-of-memory this way,
				// whatever the case.
				t.Logf("k=%d: %s failure absorbed: %s", k, failed, poolOOMRetry)
				t.Logf("k=%d: %s failure absorbed: %s", k, failed, why)
			} else {
				report(k, failed, "the error was swallowed: the operation reported success")
			}
		default:
			if !errors.Is(opErr, injected) {
				report(k, failed, "error does not match %v: %v", injected, opErr)
			}
			if !strings.Contains(opErr.Error(), failed) {
				report(k, failed, "error does not name the failed entry point: %v", opErr)
			}
		}
		if fired > 0 {
			pairs++
		}
		if f.state != nil && opErr != nil && !panicked {
			if after := f.state(); after != before {
				report(k, failed, "failed operation changed state: %s -> %s", before, after)
			}
		}
		if f.verify != nil && !panicked {
			if err, p := guard(t, c.name+" verify", f.verify); err != nil {
				report(k, failed, "object broken after the failure (panic %v): %v", p, err)
			}
		}
		if err, p := guard(t, c.name+" cleanup", f.cleanup); err != nil {
			report(k, failed, "cleanup after the failure failed (panic %v): %v", p, err)
		}
		if debugSweep {
			t.Logf("k=%d (%s failed, err %v): %+v", k, failed, opErr, snap())
		}
		now := snap()
		if fake == nil && c.driverKeeps != "" {
			for i := range now.free {
				if i < len(base.free) && now.free[i] < base.free[i] {
					t.Logf("k=%d: GPU %d free memory %d KiB lower (%s)", k, i, (base.free[i]-now.free[i])>>10, c.driverKeeps)
				}
			}
			now.free = base.free
		}
		if fake == nil && now.diff(base) != "" {
			// A real driver may finish releasing memory a moment after the
			// call that freed it returned: look once more before reporting.
			time.Sleep(50 * time.Millisecond)
			now = snap()
		}
		if now.diff(base) != "" {
			report(k, failed, "not back to baseline: %s", now.diff(base))
			base = now // report each leak once
		}
	}
	// Buffers dropped without Close are found by the garbage collector's
	// safety net: give it a chance, then check the leak count.
	runtime.GC()
	runtime.GC()
	time.Sleep(10 * time.Millisecond)
	if l := buffer.Leaks(); l != base.leaks {
		problem(fmt.Sprintf("%s: %d buffers leaked (found by the GC safety net)", c.name, l-base.leaks))
		t.Errorf("%s: buffer.Leaks %d -> %d", c.name, base.leaks, l)
	}
	record(c.name, pairs)
	t.Logf("%s: %d driver calls, %d failure points swept", c.name, n, pairs)
}

func sweepAll(t *testing.T, cases []sweepCase) {
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) { sweep(t, c) })
	}
}
