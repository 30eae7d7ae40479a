package fakecuda

import (
	_ "embed"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/cudamem/cudamem/loader"
)

//go:embed testdata/fakecuda.c
var source []byte

// ErrNoCompiler means no C compiler was found to build the fake driver.
// Callers skip unless Required reports true.
var ErrNoCompiler = errors.New("fakecuda: no C compiler")

// Required reports whether a missing C compiler must fail tests instead of
// skipping them (CUDAMEM_REQUIRE_CC set, as CI does).
func Required() bool { return os.Getenv("CUDAMEM_REQUIRE_CC") != "" }

// Compiler returns the C compiler Build uses: $CC, default cc, found on
// the PATH. The error wraps ErrNoCompiler.
func Compiler() (string, error) {
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		return "", fmt.Errorf("%w (%s): %v", ErrNoCompiler, cc, err)
	}
	return cc, nil
}

// Build compiles the fake driver into dir with $CC (default cc) and returns
// the library's path. The error wraps ErrNoCompiler when there is no
// compiler.
func Build(dir string) (string, error) {
	cc, err := Compiler()
	if err != nil {
		return "", err
	}
	src := filepath.Join(dir, "fakecuda.c")
	if err := os.WriteFile(src, source, 0o644); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "libfakecuda.so")
	b, err := exec.Command(cc, "-shared", "-fPIC", "-O1", "-Wall", "-o", out, src).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("fakecuda: %s failed: %v\n%s", cc, err, b)
	}
	return out, nil
}

// Is reports whether the library at path is the fake driver (it exports
// the fake's own test entry points). A library already loaded, as the
// driver cudamem uses, is not loaded a second time: dlopen of one path
// shares one copy.
func Is(path string) bool {
	l, err := loader.OpenLibrary(path)
	if err != nil {
		return false
	}
	defer l.Close()
	_, err = l.Lookup("fakecuda_stat")
	return err == nil
}

// Stat names one counter of the fake driver.
type Stat int

// Counters; the order matches fakecuda.c.
const (
	DeviceBytes   Stat = iota // device memory in use (cuMemAlloc, device pools' used bytes, cuMemCreate on a device)
	PinnedBytes               // pinned host memory in use
	ManagedBytes              // managed memory in use
	Allocs                    // live allocations of every kind
	Streams                   // live created streams
	Events                    // live events
	Pools                     // live created or imported pools
	VMMHandles                // live physical allocation handles
	Reservations              // live reserved address ranges
	Mappings                  // live mappings
	Registered                // live host registrations
	CtxRetains                // primary context retains
	calls                     // unused
	DeviceBytes1              // device memory in use on device 1
	Graphs                    // live graphs (captured, or being captured)
	GraphExecs                // live executable graphs
	GraphUsed                 // graph memory allocated by launches and not yet freed (bytes)
	GraphReserved             // graph memory reserved (bytes; cuDeviceGraphMemTrim gives it back)
	Contexts                  // live contexts made with cuCtxCreate
	// Crashes counts calls on which a real driver may crash the process
	// instead of returning an error: a destroyed context or green context
	// handed back to it, a stream that died with its context, or the
	// destruction of a fabric pool made without IMEX. The fake returns an
	// error instead; cudamem must never get there (tests assert zero).
	Crashes
	numStats
)

var statNames = [...]string{"device bytes", "pinned bytes", "managed bytes", "allocations", "streams", "events",
	"pools", "VMM handles", "reservations", "mappings", "host registrations", "context retains", "calls",
	"device 1 bytes", "graphs", "graph execs", "graph used bytes", "graph reserved bytes", "contexts", "driver crashes"}

func (s Stat) String() string {
	if s >= 0 && s < numStats {
		return statNames[s]
	}
	return fmt.Sprintf("Stat(%d)", int(s))
}

// Driver reads the counters of a loaded fake driver.
type Driver struct {
	stat   loader.Proc
	fabric loader.Proc
	reuse  loader.Proc
}

// FabricMode is how the fake treats fabric handles (CU_MEM_HANDLE_TYPE_FABRIC).
type FabricMode int

// Fabric modes.
const (
	// FabricNoIMEX: the device reports fabric support, but creating,
	// exporting or importing fabric-shareable memory fails with
	// CUDA_ERROR_NOT_PERMITTED, as on a machine without the IMEX service
	// (the default). As the real driver there, cuMemPoolCreate still makes
	// a pool with fabric handles (at any location type); its export is
	// refused, and destroying it counts as a crash (Crashes) and fails.
	FabricNoIMEX FabricMode = iota
	// FabricWorks: fabric handles round-trip inside the process.
	FabricWorks
	// FabricUnsupported: the device reports no fabric support and the
	// driver answers CUDA_ERROR_NOT_SUPPORTED.
	FabricUnsupported
)

// SetFabric sets the fake's fabric mode and returns the previous one.
// Exports already made stay importable in FabricWorks.
func (d *Driver) SetFabric(m FabricMode) FabricMode {
	return FabricMode(int32(d.fabric.Call(uintptr(m))))
}

// SetContextReuse makes new contexts (cuCtxCreate, green contexts) take
// the first slot of a destroyed one, so its handle names a live context
// again, as a real driver may reuse a freed context's address; off (the
// default), handles are never reused. It returns the previous setting.
func (d *Driver) SetContextReuse(on bool) bool {
	v := uintptr(0)
	if on {
		v = 1
	}
	return int32(d.reuse.Call(v)) != 0
}

// Open opens the fake driver at path (the same library the loader uses:
// dlopen of one path shares one copy) for reading its counters.
func Open(path string) (*Driver, error) {
	l, err := loader.OpenLibrary(path)
	if err != nil {
		return nil, err
	}
	p, err := l.Lookup("fakecuda_stat")
	if err != nil {
		return nil, fmt.Errorf("%s is not the fake driver: %w", path, err)
	}
	f, err := l.Lookup("fakecuda_set_fabric")
	if err != nil {
		return nil, fmt.Errorf("%s is not the fake driver: %w", path, err)
	}
	r, err := l.Lookup("fakecuda_set_ctx_reuse")
	if err != nil {
		return nil, fmt.Errorf("%s is not the fake driver: %w", path, err)
	}
	return &Driver{stat: p, fabric: f, reuse: r}, nil
}

// Stat reads one counter.
func (d *Driver) Stat(s Stat) int64 { return int64(d.stat.Call(uintptr(s))) }

// Snapshot is every counter at one moment.
type Snapshot [numStats]int64

// Snapshot reads every counter.
func (d *Driver) Snapshot() Snapshot {
	var s Snapshot
	for i := range s {
		s[i] = d.Stat(Stat(i))
	}
	return s
}

// Diff describes the counters that differ from base, or "" if none do.
func (s Snapshot) Diff(base Snapshot) string {
	var out string
	for i := range s {
		if Stat(i) == calls || s[i] == base[i] {
			continue
		}
		out += fmt.Sprintf("%s %d -> %d; ", Stat(i), base[i], s[i])
	}
	return out
}
