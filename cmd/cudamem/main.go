// Command cudamem reports on the CUDA driver and devices, and measures
// cudamem's costs beside a C baseline.
//
//	cudamem info [-json]      driver, devices, memory features, peers
//	cudamem bench [flags]     driver-call and memory benchmarks, with ratios to C
//	cudamem selftest          check every device's memory paths end to end
//
// It needs no CUDA toolkit: the driver library is loaded at run time.
// Without a driver, info says what it tried and exits with status 1.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

const usage = `usage: cudamem <command> [flags]

commands:
  info      show the CUDA driver, devices and their memory features (-json for JSON)
  bench     measure driver calls, pool allocation and copies beside a C baseline
  selftest  allocate, copy and check memory on every device (pools, pinned, managed, VMM, peers)
  help      show this help
`

// errUsage marks errors that should print the usage text.
var errUsage = errors.New("usage")

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "info":
		err = runInfo(args[1:], stdout)
	case "bench":
		err = runBench(args[1:], stdout, stderr)
	case "selftest":
		err = runSelftest(args[1:], stdout)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "cudamem: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "cudamem: %v\n\n%s", err, usage)
		return 2
	}
	fmt.Fprintf(stderr, "cudamem %s: %v\n", args[0], err)
	return 1
}
