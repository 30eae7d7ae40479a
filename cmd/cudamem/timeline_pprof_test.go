package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// -pprof profiles the demo run only, and no two outputs share a name: both
// refused as usage errors before anything runs.
func TestTimelineProfileFlagsUsage(t *testing.T) {
	for _, args := range [][]string{
		{"-in", "trace.json", "-pprof", "p.pb.gz"},
		{"-o", "a.svg", "-chrome", "a.svg"},
		{"-json", "t.json", "-pprof", "t.json"},
	} {
		code, _, stderr := runCmd(append([]string{"timeline"}, args...)...)
		assert.Equal(t, 2, code, "%q: %s", args, stderr)
		assert.True(t, strings.Contains(stderr, "-pprof") || strings.Contains(stderr, "-chrome"), "%q: %s", args, stderr)
	}
}
