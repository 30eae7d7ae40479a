// Command nccl-allreduce all-reduces cudamem buffers with NCCL, from a Go
// program built with CGO_ENABLED=0: it opens libnccl at run time
// (loader.OpenCUDALibrary) and sums a buffer of float32 per rank on
// cudamem streams, three times over, on three kinds of memory:
//
//   - pool: Buffers from the device's pool (resource.DevicePool);
//   - registered: Buffers carved by a resource.SubAllocator from
//     virtual.NCCLOptions memory (what ncclMemAlloc makes), whose blocks
//     SegmentHooks register with the communicator (ncclCommRegister) as
//     the sub-allocator takes them and deregister (ncclCommDeregister)
//     before it gives them back, also when it is closed with Buffers
//     live; the hooks' counts are checked;
//   - window: NCCLOptions memory registered as a symmetric-memory window
//     (ncclCommWindowRegister, NCCL_WIN_COLL_SYMMETRIC; NCCL 2.27 or
//     later), deregistered before it is freed. Where NCCL refuses the
//     window, or makes none, the reason is printed and the phase skipped.
//
// Every element of every rank's result is checked, before and after the
// timed loop, and the timing is printed as nccl-tests prints it:
// algorithm bandwidth (bytes / time) and bus bandwidth (algorithm
// bandwidth × 2(n−1)/n, the traffic each link carries in a ring; 0 with
// one rank, where nothing crosses a link).
//
// # One process, or one process per GPU
//
// By default one process drives every local GPU: ncclCommInitAll makes
// one communicator per GPU, and each collective is issued for all of them
// in one ncclGroupStart/ncclGroupEnd.
//
// With -ranks N the program starts N copies of itself, one per GPU (NCCL
// refuses two ranks on one GPU), each run as -rank i. Rank 0 calls
// ncclGetUniqueId and writes the 128-byte id to a file (-id; a fresh
// temporary directory when the program starts the ranks itself), which
// the other ranks wait for; each then joins with
// ncclCommInitRankScalable, which takes the id by pointer (NCCL 2.23 or
// later: ncclCommInitRank takes it by value, a 128-byte struct that
// cudamem's calls, integer and pointer arguments only, cannot pass). A
// launcher, or a shell, can start the ranks itself instead, on one host
// or several with a shared file system:
//
//	nccl-allreduce -ranks 2 -rank 0 -id /shared/nccl-id &
//	nccl-allreduce -ranks 2 -rank 1 -id /shared/nccl-id
//
// The id file must not exist beforehand (rank 0 refuses to overwrite one,
// which could be a finished run's); it holds rank 0's bootstrap address,
// so it is written readable by its owner only.
//
// Without a driver or without NCCL it exits with status 1 and says which
// is missing.
//
//	go run ./examples/nccl-allreduce [-mib 64 -iters 20 -gpus 0]
//	go run ./examples/nccl-allreduce -ranks 2 [-mib 64 -iters 20]
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"
	"unsafe"

	"github.com/cudamem/cudamem/cuda"
)

// resultPrefix starts the line on which a rank process reports its
// Result (JSON) to the process that started it.
const resultPrefix = "nccl-allreduce-result: "

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr, selfStarter))
}

// realMain is the program: args are its flags; start makes the commands
// that run ranks (-ranks), which a test replaces.
func realMain(args []string, stdout, stderr io.Writer, start starter) int {
	fs := flag.NewFlagSet("nccl-allreduce", flag.ContinueOnError)
	mib := fs.Int("mib", 64, "all-reduce `N` MiB per rank")
	iters := fs.Int("iters", 20, "`N` timed allreduces per phase")
	gpus := fs.Int("gpus", 0, "one process: `N` ranks, one per local GPU; 0: every GPU")
	ranks := fs.Int("ranks", 0, "one process per rank (and GPU): `N` ranks in all; the program starts them unless -rank is given")
	rankN := fs.Int("rank", -1, "with -ranks: run rank `I` only, in this process")
	id := fs.String("id", "", "with -rank: the `FILE` through which rank 0 gives the other ranks its ncclUniqueId (must not exist yet)")
	device := fs.Int("device", -1, "with -rank: the GPU's `ORDINAL`; -1: the rank modulo the local GPU count")
	timeout := fs.Duration("timeout", 5*time.Minute, "with -ranks: how long (a `DURATION`) the ranks may take, and ranks wait for the id file")
	usage := func() {
		fmt.Fprint(stderr, "usage: nccl-allreduce [-mib N] [-iters N] [-gpus N]\n"+
			"       nccl-allreduce -ranks N [-mib N] [-iters N] [-timeout DURATION]\n"+
			"       nccl-allreduce -ranks N -rank I -id FILE [-device ORDINAL] [-mib N] [-iters N] [-timeout DURATION]\n\n"+
			"All-reduces cudamem buffers with NCCL and checks every element. Needs a driver and NCCL.\n\nflags:\n")
		fs.SetOutput(stderr)
		fs.PrintDefaults()
	}
	fs.SetOutput(io.Discard) // the errors are printed below, once
	err := fs.Parse(args)
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	rankMode := set["rank"] || set["id"] || set["device"]
	switch {
	case err != nil:
	case fs.NArg() > 0:
		err = fmt.Errorf("takes no arguments, got %q", fs.Args())
	case *mib < 1:
		err = fmt.Errorf("-mib %d: want at least 1", *mib)
	case *iters < 1:
		err = fmt.Errorf("-iters %d: want at least 1", *iters)
	case set["gpus"] && set["ranks"]:
		err = errors.New("-gpus is for the one-process mode; with -ranks each process drives one GPU")
	case rankMode && *ranks < 1:
		err = errors.New("-rank, -id and -device need -ranks (how many ranks in all)")
	case rankMode && (*rankN < 0 || *rankN >= *ranks):
		err = fmt.Errorf("-rank %d of -ranks %d: want 0 ≤ rank < ranks", *rankN, *ranks)
	case rankMode && *id == "":
		err = errors.New("-rank needs -id, the file through which rank 0 gives the others its ncclUniqueId")
	case set["timeout"] && *ranks < 1:
		err = errors.New("-timeout applies to -ranks")
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		usage()
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "nccl-allreduce: %v\n", err)
		usage()
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintln(stderr, "nccl-allreduce:", oneLine(err))
		return 1
	}
	size := uint64(*mib) << 20
	switch {
	case rankMode:
		res, err := runRank(rankConfig{rank: *rankN, ranks: *ranks, device: *device, idPath: *id, size: size, iters: *iters, idWait: *timeout})
		if err != nil {
			return fail(err)
		}
		printResult(stdout, res)
		j, err := json.Marshal(res)
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "%s%s\n", resultPrefix, j)
	case *ranks > 0:
		rs, err := launch(*ranks, *mib, *iters, *timeout, start, stdout)
		if err != nil {
			return fail(err)
		}
		fmt.Fprintf(stdout, "%d rank processes: every element of every phase that ran checked: ok\n", len(rs))
	default:
		res, err := run(size, *iters, *gpus)
		if err != nil {
			return fail(err)
		}
		printResult(stdout, res)
	}
	return 0
}

// oneLine keeps an error message on one line (the first, plus a count of
// the rest).
func oneLine(err error) string {
	lines := strings.Split(strings.TrimSpace(err.Error()), "\n")
	if len(lines) == 1 {
		return lines[0]
	}
	return fmt.Sprintf("%s (and %d more lines: %s)", lines[0], len(lines)-1, strings.Join(lines[1:], "; "))
}

// printResult prints one process's Result: a line per phase and the
// segment hooks' counts.
func printResult(w io.Writer, res Result) {
	fmt.Fprintf(w, "NCCL %s (%s), %d rank(s) in all, ranks %v here on GPUs %v, %d MiB float32 sum (nccl-tests: busbw = algbw × 2(n-1)/n)\n",
		versionString(res.NCCLVersion), res.Library, res.Ranks, res.Local, res.GPUs, res.Bytes>>20)
	for _, p := range res.Phases {
		if !p.Ran() {
			fmt.Fprintf(w, "  %-10s skipped: %s\n", p.Name, p.Skipped)
			continue
		}
		fmt.Fprintf(w, "  %-10s %v per allreduce, algbw %.1f GB/s, busbw %.1f GB/s, every element checked: ok (%s)\n",
			p.Name, p.Time, p.AlgBW, p.BusBW, p.Memory)
	}
	if s := res.Segments; s.Registered > 0 {
		fmt.Fprintf(w, "  segment hooks: %d blocks registered, %d deregistered (%d by Trim, %d by Close with live buffers, %d at the buffers' Close after it), %d still registered: ok\n",
			s.Registered, s.Deregistered, s.ByTrim, s.AtClose, s.AfterClose, s.Live)
	}
}

// run is the one-process mode: a communicator per local GPU (the first
// gpus; 0: every one) from ncclCommInitAll.
func run(size uint64, iters, gpus int) (res Result, err error) {
	if size == 0 || size%4 != 0 || iters < 1 {
		return res, fmt.Errorf("size must be a positive multiple of 4 bytes and iters at least 1 (got %d bytes, %d iters)", size, iters)
	}
	devs, err := cuda.Devices()
	if err != nil {
		return res, devicesErr(err)
	}
	if gpus <= 0 || gpus > len(devs) {
		gpus = len(devs)
	}
	devs = devs[:gpus]
	n, err := openNCCL()
	if err != nil {
		return res, err // names the library and the paths tried, and how to add one
	}
	if err := n.need("the one-process mode needs it (use -ranks)", &n.commInitAll); err != nil {
		return res, err
	}
	res = Result{Ranks: gpus, Bytes: size, NCCLVersion: n.version, Library: n.path}

	// One communicator per device, in one call (NCCL sets each device
	// itself).
	comms := make([]uintptr, gpus)
	list := make([]int32, gpus)
	for i, d := range devs {
		list[i] = int32(d.Ordinal())
	}
	r := n.commInitAll.Call(uintptr(unsafe.Pointer(&comms[0])), uintptr(gpus), uintptr(unsafe.Pointer(&list[0])))
	runtime.KeepAlive(list)
	if err := n.check("ncclCommInitAll", r, nil); err != nil {
		return res, err
	}
	g := &group{n: n, nranks: gpus}
	defer func() {
		for _, rk := range g.ranks {
			err = errors.Join(err, rk.close())
		}
		// Last: every rank's memory is deregistered by now.
		for _, c := range comms {
			err = errors.Join(err, n.check("ncclCommDestroy", n.commDestroy.Call(c), nil))
		}
	}()
	for i, d := range devs {
		rk, err := g.newRank(i, d, comms[i])
		if err != nil {
			return res, err
		}
		g.ranks = append(g.ranks, rk)
		res.Local = append(res.Local, i)
		res.GPUs = append(res.GPUs, d.Ordinal())
	}
	err = g.phases(&res, size, iters)
	return res, err
}

// devicesErr labels an error from cuda.Devices. One that means there is
// no driver says so itself, and names the paths tried.
func devicesErr(err error) error {
	if errors.Is(err, cuda.ErrNoDriver) {
		return err
	}
	return fmt.Errorf("listing the CUDA devices: %w", err)
}
