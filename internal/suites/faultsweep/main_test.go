//go:build cudamemfault

package faultsweep

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
)

// fake reads the fake driver's counters; nil on a real driver.
var fake *fakecuda.Driver

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if v := os.Getenv(envChild); v != "" {
		// A re-executed process of TestFaultSweepFirstUse; the parent set
		// CUDAMEM_DRIVER for it.
		k, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			fmt.Println(err)
			return 2
		}
		return firstUseChild(k)
	}
	if os.Getenv("CUDAMEM_DRIVER") == "" && os.Getenv("CUDAMEM_REQUIRE_GPU") != "1" {
		d, cleanup, err := fakecuda.Install("faultsweep")
		defer cleanup()
		switch {
		case errors.Is(err, fakecuda.ErrNoCompiler) && !fakecuda.Required():
			fmt.Println("faultsweep: skipped:", err)
			return 0
		case err != nil:
			fmt.Println(err)
			return 1
		}
		fake = d
	}
	code := m.Run()
	summary()
	return code
}

// Results shared by every sweep, for the summary line.
var results struct {
	sync.Mutex
	ops      map[string]bool
	pairs    int
	problems []string
}

func record(op string, pairs int) {
	results.Lock()
	defer results.Unlock()
	if results.ops == nil {
		results.ops = map[string]bool{}
	}
	results.ops[op] = true
	results.pairs += pairs
}

func problem(s string) {
	results.Lock()
	defer results.Unlock()
	results.problems = append(results.problems, s)
}

func summary() {
	results.Lock()
	defer results.Unlock()
	drv := "real driver"
	if fake != nil {
		drv = "fake driver"
	}
	if len(results.problems) > 0 {
		p := append([]string(nil), results.problems...)
		sort.Strings(p)
		fmt.Printf("faultsweep: problems found:\n  %s\n", strings.Join(p, "\n  "))
	}
	fmt.Printf("faultsweep: %d (operation, failure point) pairs covered over %d operations (%s); %d problems\n",
		results.pairs, len(results.ops), drv, len(results.problems))
}
