//go:build !linux

package main

import (
	"fmt"
	"os"
)

// entry runs the fake-NCCL modes, which are built on Linux only (see
// fake_test.go).
func entry(string) int {
	fmt.Fprintln(os.Stderr, "nccl-allreduce test entry: the fake NCCL runs on Linux only")
	return 2
}
