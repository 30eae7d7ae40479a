// Command nccl-allreduce all-reduces cudamem buffers with NCCL, from a Go
// program built with CGO_ENABLED=0: it opens libnccl at run time
// (loader.OpenCUDALibrary), makes one communicator per local GPU with
// ncclCommInitAll (one rank on a one-GPU machine), and sums a buffer of
// float32 per rank on cudamem streams. Every element of every rank's
// result is checked, and the timing is printed as nccl-tests prints it:
// algorithm bandwidth (bytes / time) and bus bandwidth (algorithm
// bandwidth × 2(n−1)/n, the traffic each link carries in a ring; 0 with
// one rank, where nothing crosses a link).
//
// Without a driver or without NCCL it exits with status 1 and says which
// is missing.
//
//	go run ./examples/nccl-allreduce [-mib 64 -iters 20 -gpus 0]
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"time"
	"unsafe"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/loader"
	"github.com/cudamem/cudamem/resource"
)

// NCCL constants (nccl.h).
const (
	ncclFloat32 = 7 // ncclDataType_t
	ncclSum     = 0 // ncclRedOp_t
)

// nccl holds the library's functions.
type nccl struct {
	path                                         string
	version, errorString, commInitAll            loader.Proc
	groupStart, groupEnd, allReduce, commDestroy loader.Proc
}

func openNCCL() (*nccl, error) {
	lib, err := loader.OpenCUDALibrary("nccl")
	if err != nil {
		return nil, err
	}
	n := &nccl{path: lib.Path()}
	for _, f := range []struct {
		p    *loader.Proc
		name string
	}{
		{&n.version, "ncclGetVersion"}, {&n.errorString, "ncclGetErrorString"},
		{&n.commInitAll, "ncclCommInitAll"}, {&n.commDestroy, "ncclCommDestroy"},
		{&n.groupStart, "ncclGroupStart"}, {&n.groupEnd, "ncclGroupEnd"},
		{&n.allReduce, "ncclAllReduce"},
	} {
		if *f.p, err = lib.Lookup(f.name); err != nil {
			return nil, fmt.Errorf("%s: %w", lib.Path(), err)
		}
	}
	return n, nil
}

// check turns an ncclResult_t into an error naming the function.
func (n *nccl) check(fn string, r uintptr, err error) error {
	if err != nil {
		return err // not called: cudamem could not make the context current
	}
	if uint32(r) == 0 { // a C enum: the register's upper half is undefined
		return nil
	}
	msg := fmt.Sprintf("ncclResult_t %d", int32(r))
	if p := n.errorString.Call(uintptr(uint32(r))); p != 0 {
		msg = cString(p)
	}
	return fmt.Errorf("%s: %s", fn, msg)
}

// cString copies a NUL-terminated C string (at most 256 bytes): NCCL's
// static error strings, which live as long as the library.
func cString(p uintptr) string {
	ptr := *(*unsafe.Pointer)(unsafe.Pointer(&p)) // C memory, not Go's
	b := unsafe.Slice((*byte)(ptr), 256)
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

// rank is one GPU's part: its communicator, stream, buffers and the
// allreduce bound to its device (Device.Foreign makes the device's context
// current inside each call).
type rank struct {
	dev        *cuda.Device
	comm       uintptr
	s          *cuda.Stream
	send, recv *buffer.Buffer
	allReduce  *cuda.ForeignFunc
}

// Result is what one run measured.
type Result struct {
	Ranks       int
	Bytes       uint64
	Time        time.Duration // per allreduce (mean over iters)
	AlgBW       float64       // GB/s
	BusBW       float64       // GB/s
	NCCLVersion int
	Library     string
}

func main() {
	mib := flag.Int("mib", 64, "MiB per rank to all-reduce")
	iters := flag.Int("iters", 20, "timed allreduces")
	gpus := flag.Int("gpus", 0, "ranks (one per GPU); 0: every GPU")
	flag.Parse()
	res, err := run(uint64(*mib)<<20, *iters, *gpus)
	if err != nil {
		fmt.Fprintln(os.Stderr, "nccl-allreduce:", err)
		os.Exit(1)
	}
	fmt.Printf("NCCL %d (%s), %d rank(s), %d MiB float32 sum: %v per allreduce, algbw %.1f GB/s, busbw %.1f GB/s (nccl-tests: busbw = algbw × 2(n-1)/n)\n",
		res.NCCLVersion, res.Library, res.Ranks, res.Bytes>>20, res.Time, res.AlgBW, res.BusBW)
	fmt.Println("every element checked: ok")
}

func run(size uint64, iters, gpus int) (res Result, err error) {
	if size == 0 || size%4 != 0 || iters < 1 {
		return res, fmt.Errorf("size must be a positive multiple of 4 bytes and iters at least 1 (got %d bytes, %d iters)", size, iters)
	}
	devs, err := cuda.Devices()
	if err != nil {
		return res, fmt.Errorf("no CUDA driver or device: %w", err)
	}
	if gpus <= 0 || gpus > len(devs) {
		gpus = len(devs)
	}
	devs = devs[:gpus]
	n, err := openNCCL()
	if err != nil {
		return res, fmt.Errorf("NCCL not found (install it, or name its directory in CUDAMEM_LIBRARY_PATH): %w", err)
	}
	var ver int32
	if err := n.check("ncclGetVersion", n.version.Call(uintptr(unsafe.Pointer(&ver))), nil); err != nil {
		return res, err
	}
	res = Result{Ranks: gpus, Bytes: size, NCCLVersion: int(ver), Library: n.path}

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
	ranks := make([]*rank, gpus)
	defer func() {
		for _, rk := range ranks {
			if rk == nil {
				continue
			}
			err = errors.Join(err, rk.send.Close(), rk.recv.Close(), rk.s.Sync(), rk.s.Close())
		}
		for _, c := range comms {
			err = errors.Join(err, n.check("ncclCommDestroy", n.commDestroy.Call(c), nil))
		}
	}()

	count := size / 4
	for i, d := range devs {
		rk := &rank{dev: d, comm: comms[i]}
		if rk.s, err = d.NewStream(); err != nil {
			return res, err
		}
		ranks[i] = rk
		pool, err := resource.NewDevicePool(d, nil) // the device's own pool
		if err != nil {
			return res, err
		}
		if rk.send, err = pool.Allocate(size, rk.s); err != nil {
			return res, err
		}
		if rk.recv, err = pool.Allocate(size, rk.s); err != nil {
			return res, err
		}
		in := make([]float32, count)
		for j := range in {
			in[j] = float32(i+1) + float32(j%7) // rank- and element-dependent
		}
		if err := buffer.CopyFromHost(rk.send, in, rk.s); err != nil {
			return res, err
		}
		if rk.allReduce, err = d.Foreign(n.allReduce); err != nil {
			return res, err
		}
	}

	once := func() error {
		// Group calls keep per-thread state: one OS thread from start to
		// end.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if gpus > 1 {
			if err := n.check("ncclGroupStart", n.groupStart.Call(), nil); err != nil {
				return err
			}
		}
		var first error
		for _, rk := range ranks {
			r, cerr := rk.allReduce.Call(uintptr(rk.send.Ptr()), uintptr(rk.recv.Ptr()), uintptr(count), ncclFloat32, ncclSum, rk.comm, rk.s.Handle())
			if err := n.check("ncclAllReduce", r, cerr); err != nil && first == nil {
				first = err
			}
		}
		if gpus > 1 {
			if err := n.check("ncclGroupEnd", n.groupEnd.Call(), nil); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	syncAll := func() error {
		for _, rk := range ranks {
			if err := rk.s.Sync(); err != nil {
				return err
			}
		}
		return nil
	}
	if err := once(); err != nil { // warm-up, and the result checked below
		return res, err
	}
	if err := syncAll(); err != nil {
		return res, err
	}
	if err := check(ranks, count); err != nil {
		return res, err
	}
	start := time.Now()
	for range iters {
		if err := once(); err != nil {
			return res, err
		}
	}
	if err := syncAll(); err != nil {
		return res, err
	}
	res.Time = time.Since(start) / time.Duration(iters)
	res.AlgBW = float64(size) / res.Time.Seconds() / 1e9
	res.BusBW = res.AlgBW * 2 * float64(gpus-1) / float64(gpus)
	return res, check(ranks, count)
}

// check reads every rank's result back: element j is the sum over ranks r
// of (r+1) + j%7.
func check(ranks []*rank, count uint64) error {
	n := len(ranks)
	got := make([]float32, count)
	for i, rk := range ranks {
		if err := buffer.CopyToHost(got, rk.recv, rk.s); err != nil {
			return err
		}
		for j, v := range got {
			want := float32(n*(n+1)/2) + float32(n)*float32(j%7)
			if v != want {
				return fmt.Errorf("rank %d (%v), element %d: got %v, want %v", i, rk.dev, j, v, want)
			}
		}
	}
	return nil
}
