//go:build cudamemfault

package faultsweep

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/faultinject"
	"github.com/cudamem/cudamem/resource"
)

// The other sweeps run each operation once before sweeping it, so the
// process-wide state made on first use (device enumeration, primary
// contexts, the pinned staging pool) is never made under a failure. This
// sweep re-executes the test binary once per failure point, so that each
// process meets the failure on its very first use, and then checks that the
// failure did not degrade the process: the same work, done again, must
// succeed, return the right data, and run the same way (a pinned staged
// copy must stay staged).

const (
	envChild      = "FAULTSWEEP_FIRST_USE_K"
	envCleanCalls = "FAULTSWEEP_FIRST_USE_CALLS"
	childPrefix   = "faultsweep-child:"
)

// firstUse is the work: a device, an owned pool, a stream, and an 8 MiB
// staged copy to the device and back.
func firstUse() (err error) {
	d, err := cuda.GetDevice(0)
	if err != nil {
		return err
	}
	p, err := resource.NewDevicePool(d, &resource.DevicePoolOptions{MaxSize: 64 << 20})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, p.Close()) }()
	s, err := d.NewStream()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	b, err := p.Allocate(8<<20, s)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.Close()) }()
	want := pattern(8<<20, 1)
	if err := buffer.CopyFromHost(b, want, s); err != nil {
		return err
	}
	got := make([]byte, len(want))
	if err := buffer.CopyToHost(got, b, s); err != nil {
		return err
	}
	if !bytes.Equal(got, want) {
		return errors.New("staged copies returned wrong data")
	}
	return nil
}

// firstUseAbsorbed lists the failures the first use may survive (succeed
// anyway). The check that the process is not degraded afterwards still
// applies to them.
var firstUseAbsorbed = map[string]string{
	"cuDeviceGetAttribute":  featuresAbsorbed["cuDeviceGetAttribute"],
	"cuPointerGetAttribute": queryPointerAbsorbed["cuPointerGetAttribute"],
	// Without pinned staging memory a host copy goes direct: slower, not
	// wrong.
	"cuMemHostAlloc": "staged copies fall back to direct copies without pinned memory",
	// The injected failure is out-of-memory, which pools answer by
	// trimming and retrying once.
	"cuMemAllocFromPoolAsync": poolOOMRetry,
}

// firstUseChild runs in the re-executed process: it fails call k of the
// first use and prints what it found on lines starting with childPrefix.
func firstUseChild(k int64) int {
	say := func(format string, args ...any) { fmt.Printf(childPrefix+" "+format+"\n", args...) }
	// Loading (opening the driver and resolving its entry points) is not
	// swept: a failed load is final by design.
	_, _, err := cuda.Driver()
	if err != nil {
		say("problem load: %v", err)
		return 1
	}
	faultinject.FailCall(k, int32(injected))
	err1 := firstUse()
	calls1 := faultinject.Calls()
	fired, addr := faultinject.Fired()
	faultinject.Reset()
	failed := faultinject.ProcName(addr)
	err2 := firstUse()
	calls2 := faultinject.Calls()
	say("calls %d %d", calls1, calls2)
	if fired == 0 {
		if err1 != nil {
			say("problem k=%d (nothing failed): %v", k, err1)
		}
		return 0
	}
	say("fired %s", failed)
	switch {
	case err1 == nil:
		if _, ok := firstUseAbsorbed[failed]; !ok {
			say("problem k=%d (%s failed): the error was swallowed", k, failed)
		}
	case !errors.Is(err1, injected):
		say("problem k=%d (%s failed): error does not match %v: %v", k, failed, injected, err1)
	case !strings.Contains(err1.Error(), failed):
		say("problem k=%d (%s failed): error does not name the failed entry point: %v", k, failed, err1)
	}
	if err2 != nil {
		say("problem k=%d (%s failed): the process is degraded: the same work fails afterwards: %v", k, failed, err2)
	}
	if clean, _ := strconv.ParseInt(os.Getenv(envCleanCalls), 10, 64); err2 == nil && clean > 0 && (calls2 < clean/2 || calls2 > 2*clean) {
		say("problem k=%d (%s failed): the process is degraded: the same work now makes %d driver calls, %d in a clean process (staging turned off?)",
			k, failed, calls2, clean)
	}
	return 0
}

func runChild(t *testing.T, k, clean int64) (lines []string) {
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d", envChild, k), fmt.Sprintf("%s=%d", envCleanCalls, clean))
	out, err := cmd.CombinedOutput()
	for _, l := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(l, childPrefix) {
			lines = append(lines, strings.TrimSpace(strings.TrimPrefix(l, childPrefix)))
		}
	}
	if err != nil || len(lines) == 0 {
		problem(fmt.Sprintf("first use k=%d: the process died: %v", k, err))
		t.Errorf("first use k=%d: child failed (%v):\n%s", k, err, out)
	}
	return lines
}

// TestFaultSweepFirstUse fails each driver call of a process's first use
// of the library in turn, in a fresh process each time.
func TestFaultSweepFirstUse(t *testing.T) {
	needDevices(t, 1)
	var n, clean int64
	for _, l := range runChild(t, 0, 0) {
		if _, err := fmt.Sscanf(l, "calls %d %d", &n, &clean); err == nil {
			break
		}
	}
	if n == 0 {
		t.Fatalf("the clean first use made no driver calls (or did not report them)")
	}
	pairs := 0
	for k := int64(1); k <= n; k++ {
		for _, l := range runChild(t, k, clean) {
			switch {
			case strings.HasPrefix(l, "fired "):
				pairs++
			case strings.HasPrefix(l, "problem "):
				msg := "first use " + strings.TrimPrefix(l, "problem ")
				problem(msg)
				t.Error(msg)
			}
		}
	}
	record("first use (fresh process)", pairs)
	t.Logf("first use: %d driver calls (%d when repeated), %d failure points swept", n, clean, pairs)
}
