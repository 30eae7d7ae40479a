package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/ipc"
	"github.com/cudamem/cudamem/resource"
)

// The IPC measurements. ipc/pool_create_export makes, exports and
// destroys an IPC-enabled pool with one exported buffer per iteration;
// ipc/child_import starts one child process per iteration, which imports
// the pool and one buffer and reports how long that took (and, as
// ipc/child_init, how long loading the driver and making the context
// current took before it).
const (
	ipcChildArg  = "-ipc-child" // bench's hidden first argument in the child
	ipcEnvDesc   = "CUDAMEM_BENCH_IPC_DESC"
	ipcEnvDevice = "CUDAMEM_BENCH_IPC_DEVICE"
	ipcEnvLock   = "CUDAMEM_BENCH_IPC_LOCK"  // "1": the child locks its goroutine to one thread, as C's runs on one
	ipcEnvAgain  = "CUDAMEM_BENCH_IPC_AGAIN" // "1": the child imports once untimed and times its second import
	ipcEnvRaw    = "CUDAMEM_BENCH_IPC_RAW"   // "1": the child imports through package cuda alone (childImportRaw)
	ipcBufSize   = 1 << 20
	ipcFill      = 42 // the byte the parent fills the shared buffer with
)

// ipcChildReport is what the child prints on stdout, one JSON line.
type ipcChildReport struct {
	InitNs   int64 `json:"init_ns"`   // driver load, cuInit, primary context
	ImportNs int64 `json:"import_ns"` // pool from the fd, buffer from the descriptor
	First    []int `json:"first"`     // the buffer's first bytes, read back
	// Steps splits ImportNs, their sum: the handle from the fd and
	// token, the descriptor decoded, the pool imported, the buffer
	// imported (the probes between them are not counted).
	Steps [4]int64 `json:"steps"`
	// Faults are the minor page faults of each step (getrusage; -1
	// where not counted): first touches of code, heap and stack a fresh
	// process makes.
	Faults [4]int64 `json:"faults"`
	// Threads is how many OS threads the import ran on: the driver keeps
	// per-thread state, and a goroutine that moves pays for a new one.
	Threads int `json:"threads"`
}

// ipcChildSteps names ipcChildReport.Steps.
var ipcChildSteps = [4]string{"handle", "descriptor", "pool", "buffer"}

// ipcRawSteps names them for childImportRaw: its driver calls.
var ipcRawSteps = [4]string{"cuMemPoolImportFromShareableHandle", "cuMemPoolImportPointer", "cuMemGetAddressRange", ""}

func ipcMeasurements(e *benchEnv) []measurement {
	skip := ""
	if runtime.GOOS != "linux" {
		skip = "IPC pools use POSIX file descriptors (Linux only)"
	} else if f, err := e.dev.Features(); err != nil {
		skip = fmt.Sprintf("reading %v's features: %v", e.dev, err)
	} else if !f.PoolIPC {
		skip = fmt.Sprintf("%v cannot export pools as POSIX file descriptors", e.dev)
	}
	initSide := &side{name: "ipc/child_init", baseline: "ipc/child_init/c"}
	child := &ipcChild{e: e, init: initSide}
	lockedInit := &side{name: "ipc/child_init/locked", baseline: "ipc/child_init/c"}
	locked := &ipcChild{e: e, init: lockedInit, lock: true}
	again := &ipcChild{e: e, init: &side{}, again: true}
	raw := &ipcChild{e: e, init: &side{}, raw: true}
	return []measurement{
		{name: "ipc/pool_create_export", baseline: "ipc/pool_create_export/c", iters: 200, skip: skip,
			run: func(n int) (time.Duration, error) {
				return timed(n, nil, func() error { return poolCreateExport(e) })
			}},
		{name: "ipc/child_import", baseline: "ipc/child_import/c", iters: 10, skip: skip,
			setup: child.setup, run: child.run, sides: []*side{initSide}},
		// The same with the child's goroutine locked to its thread, as
		// the C child runs on one: the difference is what a goroutine
		// moving to another thread during the import costs.
		{name: "ipc/child_import/locked", baseline: "ipc/child_import/c", iters: 5, skip: skip,
			setup: locked.setupFrom(child), run: locked.run, sides: []*side{lockedInit}},
		// The second import of a child that has made one and let it go:
		// the import without the process's first-time work (its code's
		// first run, the driver's first import), beside C's second.
		{name: "ipc/child_import/again", baseline: "ipc/child_import/again/c", iters: 10, skip: skip,
			setup: again.setupFrom(child), run: again.run},
		// The same driver calls as C's child, through package cuda alone,
		// each timed, with the bounds check's cuMemGetAddressRange: what
		// of the import is the driver's from Go, and what is package ipc's.
		{name: "ipc/child_import/raw", baseline: "ipc/child_import/c", iters: 10, skip: skip,
			setup: raw.setupFrom(child), run: raw.run},
	}
}

// poolCreateExport is one iteration of ipc/pool_create_export, through the
// public API: an IPC-enabled pool, its export to an fd, one buffer
// allocated and exported, then everything closed.
func poolCreateExport(e *benchEnv) (err error) {
	p, err := resource.NewDevicePool(e.dev, &resource.DevicePoolOptions{IPC: true})
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, p.Close()) }()
	h, err := ipc.ExportPool(p)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, h.Close()) }()
	b, err := p.Allocate(ipcBufSize, e.stream)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, b.Close()) }()
	_, err = ipc.ExportBuffer(b)
	return err
}

// ipcChild is the parent side of ipc/child_import: one pool, one buffer
// filled with ipcFill, exported once, and a child per iteration.
type ipcChild struct {
	e     *benchEnv
	init  *side
	lock  bool // the child locks its goroutine to its thread
	again bool // the child times its second import
	raw   bool // the child imports through package cuda alone
	exe   string
	h     *ipc.Handle
	desc  string // the buffer's descriptor, hex
	ready bool
	runs  int // calls of run so far; runOne's first is its warm-up
}

// setupFrom returns a setup that shares other's pool and buffer.
func (c *ipcChild) setupFrom(other *ipcChild) func() error {
	return func() error {
		if err := other.setup(); err != nil {
			return err
		}
		c.exe, c.h, c.desc, c.ready = other.exe, other.h, other.desc, true
		return nil
	}
}

func (c *ipcChild) setup() error {
	if c.ready {
		return nil
	}
	e := c.e
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	p, err := resource.NewDevicePool(e.dev, &resource.DevicePoolOptions{IPC: true})
	if err != nil {
		return err
	}
	e.cleanup = append(e.cleanup, p.Close)
	b, err := p.Allocate(ipcBufSize, e.stream)
	if err != nil {
		return err
	}
	e.cleanup = append(e.cleanup, b.Close)
	if err := b.Fill8(ipcFill, e.stream); err != nil {
		return err
	}
	if err := e.stream.Sync(); err != nil {
		return err
	}
	d, err := ipc.ExportBuffer(b)
	if err != nil {
		return err
	}
	raw, err := d.MarshalBinary()
	if err != nil {
		return err
	}
	h, err := ipc.ExportPool(p)
	if err != nil {
		return err
	}
	e.cleanup = append(e.cleanup, h.Close)
	c.exe, c.h, c.desc, c.ready = exe, h, hex.EncodeToString(raw), true
	return nil
}

// run starts n children one after another and returns the sum of the
// import times they report; the sum of their init times goes to c.init.
func (c *ipcChild) run(n int) (time.Duration, error) {
	var imp, ini time.Duration
	var steps [4]time.Duration
	var faults [4]int64
	moved := 0
	for i := 0; i < n; i++ {
		rep, err := c.once()
		if err != nil {
			return 0, err
		}
		imp += time.Duration(rep.ImportNs)
		ini += time.Duration(rep.InitNs)
		for j, v := range rep.Steps {
			steps[j] += time.Duration(v)
			faults[j] += rep.Faults[j]
		}
		if rep.Threads > 1 {
			moved++
		}
	}
	c.init.d = ini
	c.runs++
	if c.e.stderr != nil && c.runs > 1 { // not for the warm-up
		var parts []string
		names := ipcChildSteps
		if c.raw {
			names = ipcRawSteps
		}
		for j, d := range steps {
			if names[j] == "" {
				continue
			}
			part := fmt.Sprintf("%s %v", names[j], (d / time.Duration(n)).Round(time.Microsecond/10))
			if faults[j] >= 0 {
				part += fmt.Sprintf(" (%d faults)", faults[j]/int64(n))
			}
			parts = append(parts, part)
		}
		name := "ipc/child_import"
		switch {
		case c.lock:
			name += "/locked"
		case c.again:
			name += "/again"
		case c.raw:
			name += "/raw"
		}
		fmt.Fprintf(c.e.stderr, "bench: %s, mean of %d children: %s; %d of %d changed OS thread during the import\n", name, n, strings.Join(parts, ", "), moved, n)
	}
	return imp, nil
}

func (c *ipcChild) once() (*ipcChildReport, error) {
	f, err := c.h.ExtraFile()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(c.exe, "bench", ipcChildArg)
	lock := "0"
	if c.lock {
		lock = "1"
	}
	cmd.Env = append(os.Environ(),
		ipcEnvDesc+"="+c.desc,
		ipcEnvDevice+"="+strconv.Itoa(c.e.dev.Ordinal()),
		ipcEnvLock+"="+lock)
	if c.again {
		cmd.Env = append(cmd.Env, ipcEnvAgain+"=1")
	}
	if c.raw {
		cmd.Env = append(cmd.Env, ipcEnvRaw+"=1")
	}
	// The token holds the pool's key: over the child's stdin, never in
	// its environment (inherited by whatever it starts, and readable in
	// /proc/PID/environ).
	cmd.Stdin = strings.NewReader(c.h.Token() + "\n")
	cmd.ExtraFiles = []*os.File{f}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("child %s bench %s: %w: %s", c.exe, ipcChildArg, err, strings.TrimSpace(stderr.String()))
	}
	return parseChildReport(out)
}

// parseChildReport reads the child's line and checks the bytes it read.
func parseChildReport(out []byte) (*ipcChildReport, error) {
	var rep ipcChildReport
	if err := json.Unmarshal(bytes.TrimSpace(out), &rep); err != nil {
		return nil, fmt.Errorf("child printed %q: %w", out, err)
	}
	if len(rep.First) == 0 {
		return nil, fmt.Errorf("child read no bytes back (printed %q)", out)
	}
	for i, v := range rep.First {
		if v != ipcFill {
			return nil, fmt.Errorf("child read byte %d as %d, want %d: the import does not show the parent's memory", i, v, ipcFill)
		}
	}
	if rep.ImportNs <= 0 || rep.InitNs <= 0 {
		return nil, fmt.Errorf("child reported times %d ns (init), %d ns (import)", rep.InitNs, rep.ImportNs)
	}
	return &rep, nil
}

// runIPCChild is the child of ipc/child_import: it reads the pool's token
// from stdin, loads the driver and makes the context current (init), then
// imports the pool from fd 3 and the buffer from its descriptor (import),
// reads the first bytes back, closes everything and prints an
// ipcChildReport.
func runIPCChild(stdout io.Writer) (err error) {
	token, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		return fmt.Errorf("reading the pool's token from stdin: %w", err)
	}
	if os.Getenv(ipcEnvLock) == "1" {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
	}
	// The descriptor's bytes come from the environment before the clock
	// starts, as the C child's do: transport, not import.
	raw, err := hex.DecodeString(os.Getenv(ipcEnvDesc))
	if err != nil {
		return fmt.Errorf("%s: %w", ipcEnvDesc, err)
	}
	t0 := time.Now()
	ord, err := strconv.Atoi(os.Getenv(ipcEnvDevice))
	if err != nil {
		return fmt.Errorf("%s: %w", ipcEnvDevice, err)
	}
	dev, err := cuda.GetDevice(ord)
	if err != nil {
		return describeLoadError(err)
	}
	if _, err := dev.Context(); err != nil {
		return err
	}
	t1 := time.Now()
	token = strings.TrimSpace(token)
	if os.Getenv(ipcEnvAgain) == "1" {
		// The first import, untimed, from a duplicate of the pool's fd
		// (the Handle takes the fd it is given and closes it).
		fd, err := dupFD(3)
		if err != nil {
			return fmt.Errorf("duplicating the pool's fd: %w", err)
		}
		if _, err := childImport(dev, fd, token, raw, nil); err != nil {
			return fmt.Errorf("the first of two imports: %w", err)
		}
	}
	var rep ipcChildReport
	importer := childImport
	if os.Getenv(ipcEnvRaw) == "1" {
		importer = childImportRaw
	}
	first, err := importer(dev, 3, token, raw, &rep)
	if err != nil {
		return err
	}
	rep.InitNs, rep.First = t1.Sub(t0).Nanoseconds(), first
	return json.NewEncoder(stdout).Encode(rep)
}

// childImport is the child's import: the Handle from fd and token, the
// descriptor decoded from raw, the pool and the buffer imported, the
// buffer's first bytes read back, everything closed again. The steps'
// times and faults go to rep, when set.
func childImport(dev *cuda.Device, fd int, token string, raw []byte, rep *ipcChildReport) (first []int, err error) {
	var steps, faults [4]int64
	tids := map[int]bool{gettid(): true}
	lastFaults := minorFaults()
	last := time.Now()
	step := func(i int) {
		now := time.Now()
		steps[i] = now.Sub(last).Nanoseconds()
		f := minorFaults()
		faults[i] = f - lastFaults
		if f < 0 {
			faults[i] = -1
		}
		tids[gettid()] = true
		// The probes' own time and faults count in no step.
		lastFaults = minorFaults()
		last = time.Now()
	}
	h, err := ipc.NewHandle(fd, token)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, h.Close()) }()
	step(0)
	var d ipc.Descriptor
	if err := d.UnmarshalBinary(raw); err != nil {
		return nil, err
	}
	step(1)
	p, err := ipc.ImportPool(dev, h)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, p.Close()) }()
	step(2)
	b, err := p.Import(d, nil)
	if err != nil {
		return nil, err
	}
	step(3)
	defer func() { err = errors.Join(err, b.Close()) }()
	if rep != nil {
		rep.ImportNs = steps[0] + steps[1] + steps[2] + steps[3]
		rep.Steps, rep.Faults, rep.Threads = steps, faults, len(tids)
	}
	return readFirst(b, 4)
}

// childImportRaw is childImport through package cuda alone, each driver
// call a step: the pool from fd, the pointer from the descriptor's export
// data, and the pointer's allocation range (the bounds check Import adds;
// C's child makes the first two). No Handle, no MAC check, no Buffer.
func childImportRaw(dev *cuda.Device, fd int, _ string, raw []byte, rep *ipcChildReport) (first []int, err error) {
	var d ipc.Descriptor
	if err := d.UnmarshalBinary(raw); err != nil {
		return nil, err
	}
	var steps [4]int64
	last := time.Now()
	step := func(i int) {
		now := time.Now()
		steps[i], last = now.Sub(last).Nanoseconds(), now
	}
	pool, err := dev.ImportMemPoolFD(fd)
	if err != nil {
		return nil, err
	}
	step(0)
	defer func() { err = errors.Join(err, dev.Sync(), pool.Destroy()) }()
	ptr, err := pool.ImportPointer(&d.Data)
	if err != nil {
		return nil, err
	}
	step(1)
	defer func() { err = errors.Join(err, dev.DefaultStream().MemFreeAsync(ptr)) }()
	if _, _, err := dev.MemGetAddressRange(ptr); err != nil {
		return nil, err
	}
	step(2)
	rep.ImportNs = steps[0] + steps[1] + steps[2]
	rep.Steps, rep.Faults, rep.Threads = steps, [4]int64{-1, -1, -1, -1}, 1
	b := make([]byte, 4)
	s := dev.DefaultStream()
	if err := s.MemcpyDtoHAsync(unsafe.Pointer(&b[0]), ptr, uint64(len(b))); err != nil {
		return nil, err
	}
	if err := s.Sync(); err != nil {
		return nil, err
	}
	first = make([]int, len(b))
	for i, v := range b {
		first[i] = int(v)
	}
	return first, nil
}

func readFirst(b *buffer.Buffer, n int) ([]int, error) {
	p := make([]byte, n)
	if _, err := b.ReadAt(p, 0); err != nil {
		return nil, err
	}
	out := make([]int, n)
	for i, v := range p {
		out[i] = int(v)
	}
	return out, nil
}
