// Package frames reads the call stacks that the memory packages capture
// (resource.Tracking, timeline.Recorder; gpuprof writes them): the frames
// of cudamem's own allocation path sit on top of every such stack and say
// nothing about the allocation site, so they are left out there.
package frames

import (
	"encoding/binary"
	"iter"
	"runtime"
	"strings"
)

// Depth is how many frames a captured stack keeps: enough to reach the
// test or handler that allocated through a few layers of helpers.
const Depth = 32

// own are the packages on the allocation path: the adaptors,
// sub-allocator and pools of package resource, the timeline's Recorder,
// and package buffer (Allocate, and the methods that allocate through it).
var own = []string{
	"github.com/cudamem/cudamem/buffer.",
	"github.com/cudamem/cudamem/resource.",
	"github.com/cudamem/cudamem/resource/metrics.",
	"github.com/cudamem/cudamem/resource/timeline.",
}

// Own reports whether the function fn (as runtime.Frame names it) is in
// one of cudamem's packages on the allocation path.
func Own(fn string) bool {
	for _, p := range own {
		if strings.HasPrefix(fn, p) {
			return true
		}
	}
	return false
}

// Site yields the frames of pcs, innermost first, from the first one
// that is not Own: the allocation site and its callers. The runtime's
// goroutine exit is left out. Own frames further down stay (an
// allocation made in a callback that an adaptor called).
func Site(pcs []uintptr) iter.Seq[runtime.Frame] {
	return func(yield func(runtime.Frame) bool) {
		if len(pcs) == 0 {
			return
		}
		frames := runtime.CallersFrames(pcs)
		top := true
		for {
			f, more := frames.Next()
			if !(top && Own(f.Function)) && f.Function != "runtime.goexit" {
				top = false
				if !yield(f) {
					return
				}
			}
			if !more {
				return
			}
		}
	}
}

// Key is a stack as a map key.
func Key(pcs []uintptr) string {
	b := make([]byte, 0, len(pcs)*8)
	for _, pc := range pcs {
		b = binary.LittleEndian.AppendUint64(b, uint64(pc))
	}
	return string(b)
}
