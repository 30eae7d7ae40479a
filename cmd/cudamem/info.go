package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/internal/testkit/fakecuda"
	"github.com/cudamem/cudamem/loader"
)

// Info is what `cudamem info` reports.
type Info struct {
	Driver  DriverInfo   `json:"driver"`
	Devices []DeviceInfo `json:"devices"`
}

// DriverInfo describes the loaded driver library.
type DriverInfo struct {
	Path    string   `json:"path"`
	Version string   `json:"version"` // e.g. "13.0"
	Raw     int      `json:"version_number"`
	Missing []string `json:"missing_entry_points,omitempty"`
	// Fake is set when the library is cudamem's fake driver (host
	// memory, no GPU: see cudamem fake-driver).
	Fake bool `json:"fake,omitempty"`
}

// DeviceInfo describes one device.
type DeviceInfo struct {
	Ordinal           int      `json:"ordinal"`
	Name              string   `json:"name"`
	UUID              string   `json:"uuid"`
	PCIBusID          string   `json:"pci_bus_id"`
	TotalMemory       uint64   `json:"total_memory"`
	ComputeCapability string   `json:"compute_capability"`
	MemoryPools       bool     `json:"memory_pools"`
	VirtualMemory     bool     `json:"virtual_memory"`
	PosixFDIPC        bool     `json:"posix_fd_ipc"`
	PoolIPC           bool     `json:"pool_ipc"`
	GPUDirectRDMA     bool     `json:"gpudirect_rdma"`
	ManagedMemory     bool     `json:"managed_memory"`
	ConcurrentManaged bool     `json:"concurrent_managed_access"`
	HostNUMAID        int      `json:"host_numa_id"`
	Peers             []int    `json:"peers"`
	Errors            []string `json:"errors,omitempty"`
}

func runInfo(args []string, w, stderr io.Writer) error {
	fs := newFlagSet("info", stderr)
	asJSON := fs.Bool("json", false, "print JSON (on failure, a JSON object with an \"error\" field)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: takes no arguments, got %q", errUsage, fs.Args())
	}
	info, err := collectInfo(source)
	if err != nil {
		if *asJSON {
			if jerr := writeJSON(w, jsonError(err)); jerr != nil {
				return errors.Join(err, jerr)
			}
		}
		return describeLoadError(err)
	}
	if *asJSON {
		if err := writeJSON(w, info); err != nil {
			return err
		}
	} else {
		printInfo(w, info)
	}
	// What could be read is printed above; a failed query still makes the
	// command fail, so scripts do not mistake a broken driver for a
	// healthy one.
	return queryErrors(info)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// InfoError is what `cudamem info -json` prints when it cannot report
// (no driver, or listing the devices failed).
type InfoError struct {
	Error    string        `json:"error"`
	NoDriver bool          `json:"no_driver"`
	Attempts []AttemptInfo `json:"attempts,omitempty"` // paths tried, when no driver loaded
	Hint     string        `json:"hint,omitempty"`
}

// AttemptInfo is one driver library path tried and why it failed.
type AttemptInfo struct {
	Path  string `json:"path"`
	Error string `json:"error"`
}

func jsonError(err error) InfoError {
	out := InfoError{Error: err.Error(), NoDriver: errors.Is(err, cuda.ErrNoDriver)}
	var le *loader.LoadError
	if errors.As(err, &le) {
		out.NoDriver = true
		for _, a := range le.Attempts {
			out.Attempts = append(out.Attempts, AttemptInfo{Path: a.Path, Error: a.Reason()})
		}
		out.Hint = le.Hint()
	}
	return out
}

// queryErrors returns an error listing every failed device query, or nil.
func queryErrors(info *Info) error {
	var failed []string
	for _, d := range info.Devices {
		for _, e := range d.Errors {
			failed = append(failed, fmt.Sprintf("GPU %d: %s", d.Ordinal, e))
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return fmt.Errorf("%d device queries failed:\n  %s", len(failed), strings.Join(failed, "\n  "))
}

// infoDevice is what info asks of a device; *cuda.Device provides it, and
// tests substitute a device whose queries fail.
type infoDevice interface {
	Ordinal() int
	String() string
	Name() (string, error)
	UUID() (cuda.UUID, error)
	PCIBusID() (string, error)
	TotalMemory() (uint64, error)
	ComputeCapability() (major, minor int, err error)
	Features() (cuda.Features, error)
}

// infoSource is where info gets the driver and its devices.
type infoSource interface {
	Driver() (path string, version int, err error)
	Missing() ([]string, error)
	Devices() ([]infoDevice, error)
	CanAccessPeer(d, peer infoDevice) (bool, error)
}

// source is the driver info reads; tests replace it.
var source infoSource = cudaSource{}

// isFake reports whether the driver library at path is cudamem's fake
// driver; tests replace it.
var isFake = fakecuda.Is

// fakeNote is what info, selftest and version say of the fake driver.
const fakeNote = "cudamem's fake driver: host memory, no GPU (unset CUDAMEM_DRIVER for the real one)"

// cudaSource is the real driver.
type cudaSource struct{}

func (cudaSource) Driver() (string, int, error) { return cuda.Driver() }
func (cudaSource) Missing() ([]string, error)   { return cuda.DriverMissing() }
func (cudaSource) Devices() ([]infoDevice, error) {
	ds, err := cuda.Devices()
	out := make([]infoDevice, len(ds))
	for i, d := range ds {
		out[i] = d
	}
	return out, err
}

func (cudaSource) CanAccessPeer(d, peer infoDevice) (bool, error) {
	a, aok := d.(*cuda.Device)
	b, bok := peer.(*cuda.Device)
	if !aok || !bok {
		return false, fmt.Errorf("%v or %v is not a CUDA device", d, peer)
	}
	return a.CanAccessPeer(b)
}

// describeLoadError turns a load failure into a message listing what was
// tried, one path per line, and how to change the search.
func describeLoadError(err error) error {
	var le *loader.LoadError
	if !errors.As(err, &le) {
		return err
	}
	var b strings.Builder
	b.WriteString("no CUDA driver found")
	if le.Reason != "" {
		b.WriteString(": " + le.Reason)
	}
	for _, a := range le.Attempts {
		from := ""
		if le.FromEnv {
			from = " (from " + loader.EnvDriver + ")"
		}
		fmt.Fprintf(&b, "\n  tried %s%s: %s", a.Path, from, a.Reason())
	}
	if hint := le.Hint(); hint != "" {
		b.WriteString("\n" + hint)
	}
	return &loadError{msg: b.String(), err: err}
}

// loadError is describeLoadError's result: its own text, but it still
// matches what it describes (cuda.ErrNoDriver, *loader.LoadError).
type loadError struct {
	msg string
	err error
}

func (e *loadError) Error() string { return e.msg }
func (e *loadError) Unwrap() error { return e.err }

func collectInfo(src infoSource) (*Info, error) {
	path, version, err := src.Driver()
	if err != nil {
		return nil, err
	}
	missing, _ := src.Missing() // the driver loaded, so this cannot fail
	info := &Info{Driver: DriverInfo{Path: path, Version: cuda.VersionString(version), Raw: version, Missing: missing, Fake: isFake(path)}}
	devs, err := src.Devices()
	if err != nil {
		return nil, fmt.Errorf("driver %s (CUDA %s) loaded, but listing its devices failed: %w", path, cuda.VersionString(version), err)
	}
	for _, d := range devs {
		di := DeviceInfo{Ordinal: d.Ordinal(), Peers: []int{}, HostNUMAID: -1}
		note := func(what string, err error) {
			if err != nil {
				di.Errors = append(di.Errors, what+": "+err.Error())
			}
		}
		di.Name, err = d.Name()
		note("name", err)
		u, err := d.UUID()
		note("uuid", err)
		di.UUID = u.GPUString()
		di.PCIBusID, err = d.PCIBusID()
		note("pci bus id", err)
		di.TotalMemory, err = d.TotalMemory()
		note("total memory", err)
		major, minor, err := d.ComputeCapability()
		note("compute capability", err)
		di.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
		f, err := d.Features()
		note("features", err)
		di.MemoryPools, di.VirtualMemory, di.PosixFDIPC, di.PoolIPC = f.MemoryPools, f.VirtualMemory, f.PosixFDHandles, f.PoolIPC
		di.GPUDirectRDMA, di.ManagedMemory, di.ConcurrentManaged, di.HostNUMAID = f.GPUDirectRDMA, f.ManagedMemory, f.ConcurrentManagedAccess, f.HostNUMAID
		for _, p := range devs {
			ok, err := src.CanAccessPeer(d, p)
			note("peer "+p.String(), err)
			if ok {
				di.Peers = append(di.Peers, p.Ordinal())
			}
		}
		info.Devices = append(info.Devices, di)
	}
	return info, nil
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func printInfo(w io.Writer, info *Info) {
	fmt.Fprintf(w, "driver:  %s (CUDA %s)\n", info.Driver.Path, info.Driver.Version)
	if info.Driver.Fake {
		fmt.Fprintf(w, "note:    this is %s\n", fakeNote)
	}
	if len(info.Driver.Missing) > 0 {
		fmt.Fprintf(w, "missing: %s\n", strings.Join(info.Driver.Missing, ", "))
	}
	fmt.Fprintf(w, "devices: %d\n", len(info.Devices))
	for _, d := range info.Devices {
		fmt.Fprintf(w, "\nGPU %d: %s\n", d.Ordinal, d.Name)
		fmt.Fprintf(w, "  uuid:               %s\n", d.UUID)
		fmt.Fprintf(w, "  pci bus id:         %s\n", d.PCIBusID)
		fmt.Fprintf(w, "  memory:             %.1f GiB (%d bytes)\n", float64(d.TotalMemory)/(1<<30), d.TotalMemory)
		fmt.Fprintf(w, "  compute capability: %s\n", d.ComputeCapability)
		fmt.Fprintf(w, "  memory pools:       %s\n", yes(d.MemoryPools))
		fmt.Fprintf(w, "  virtual memory:     %s\n", yes(d.VirtualMemory))
		fmt.Fprintf(w, "  POSIX-fd IPC:       %s (pools: %s)\n", yes(d.PosixFDIPC), yes(d.PoolIPC))
		fmt.Fprintf(w, "  GPUDirect RDMA:     %s\n", yes(d.GPUDirectRDMA))
		fmt.Fprintf(w, "  managed memory:     %s (concurrent access: %s)\n", yes(d.ManagedMemory), yes(d.ConcurrentManaged))
		fmt.Fprintf(w, "  host NUMA node:     %d\n", d.HostNUMAID)
		peers := make([]string, len(d.Peers))
		for i, p := range d.Peers {
			peers[i] = fmt.Sprintf("GPU %d", p)
		}
		if len(peers) == 0 {
			peers = []string{"none"}
		}
		fmt.Fprintf(w, "  peer access to:     %s\n", strings.Join(peers, ", "))
		for _, e := range d.Errors {
			fmt.Fprintf(w, "  error:              %s\n", e)
		}
	}
}
