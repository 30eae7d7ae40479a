// Command cublas-sgemm multiplies two matrices with cuBLAS (cublasSgemm)
// on memory from cudamem, from a Go program built with CGO_ENABLED=0: it
// opens libcublas at run time (loader.OpenCUDALibrary, which also looks in
// /usr/local/cuda/lib64 and the toolkit's other directories), calls it
// through cudamem's call path, and checks the product against a CPU SGEMM.
//
// It runs on device 0 and on the last device, both ways cudamem offers to
// give foreign code a device's context: functions bound with
// cuda.Device.Foreign (the context is made current inside each call), and
// plain library functions called inside cuda.Device.Do (a locked OS thread
// with the context current). Without a driver or without cuBLAS it exits
// with status 1 and says which is missing.
//
//	go run ./examples/cublas-sgemm [-m 512 -n 384 -k 256 -reps 20]
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"time"
	"unsafe"

	"github.com/cudamem/cudamem/buffer"
	"github.com/cudamem/cudamem/cuda"
	"github.com/cudamem/cudamem/loader"
	"github.com/cudamem/cudamem/resource"
)

// cuBLAS constants (cublas_api.h).
const (
	cublasOpN = 0 // CUBLAS_OP_N
)

// cublasStatusNames names cublasStatus_t values.
var cublasStatusNames = map[uintptr]string{
	0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
	7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
	13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED",
	16: "CUBLAS_STATUS_LICENSE_ERROR",
}

// status turns a cuBLAS result into an error naming the function.
func status(fn string, r uintptr, err error) error {
	if err != nil {
		return err // not called: cudamem could not make the context current
	}
	if uint32(r) == 0 { // a C enum: the register's upper half is undefined
		return nil
	}
	name := cublasStatusNames[uintptr(uint32(r))]
	if name == "" {
		name = fmt.Sprintf("cublasStatus_t %d", int32(r))
	}
	return fmt.Errorf("%s: %s", fn, name)
}

// cublas holds the library's functions.
type cublas struct {
	create, destroy, setStream, sgemm loader.Proc
}

func openCublas() (*cublas, string, error) {
	lib, err := loader.OpenCUDALibrary("cublas")
	if err != nil {
		return nil, "", err
	}
	var c cublas
	for _, f := range []struct {
		p    *loader.Proc
		name string
	}{
		{&c.create, "cublasCreate_v2"}, {&c.destroy, "cublasDestroy_v2"},
		{&c.setStream, "cublasSetStream_v2"}, {&c.sgemm, "cublasSgemm_v2"},
	} {
		if *f.p, err = lib.Lookup(f.name); err != nil {
			return nil, "", fmt.Errorf("%s: %w", lib.Path(), err)
		}
	}
	return &c, lib.Path(), nil
}

// bound holds the functions bound to one device with Device.Foreign:
// every call makes the device's primary context current inside the
// crossing into C. A nil *bound means "call the plain functions", valid
// only inside Device.Do, whose locked thread has the context current.
//
// Each call is written out at its call site, with the
// uintptr(unsafe.Pointer(&x)) conversions in the argument list of the
// nosplit Call itself: a wrapper that ran Go code (a map lookup, an
// interface call) between the conversion and the C call could let the
// goroutine stack move under the pointers.
type bound struct {
	create, destroy, setStream, sgemm *cuda.ForeignFunc
}

func bind(dev *cuda.Device, c *cublas) (*bound, error) {
	var b bound
	for _, f := range []struct {
		dst **cuda.ForeignFunc
		p   loader.Proc
	}{{&b.create, c.create}, {&b.destroy, c.destroy}, {&b.setStream, c.setStream}, {&b.sgemm, c.sgemm}} {
		var err error
		if *f.dst, err = dev.Foreign(f.p); err != nil {
			return nil, err
		}
	}
	return &b, nil
}

func main() {
	fs := flag.NewFlagSet("cublas-sgemm", flag.ContinueOnError)
	m := fs.Int("m", 512, "`M` rows of A and C")
	n := fs.Int("n", 384, "`N` columns of B and C")
	k := fs.Int("k", 256, "`K` columns of A, rows of B")
	reps := fs.Int("reps", 20, "`N` timed SGEMMs per run")
	usage := func() {
		fmt.Fprint(os.Stderr, "usage: cublas-sgemm [-m M] [-n N] [-k K] [-reps N]\n\n"+
			"Multiplies two random matrices with cuBLAS on cudamem memory and checks the product\n"+
			"against the CPU. Needs a driver and cuBLAS.\n\nflags:\n")
		fs.SetOutput(os.Stderr)
		fs.PrintDefaults()
	}
	fs.SetOutput(io.Discard) // the errors are printed below, once
	err := fs.Parse(os.Args[1:])
	switch {
	case err != nil:
	case fs.NArg() > 0:
		err = fmt.Errorf("takes no arguments, got %q", fs.Args())
	case *m <= 0 || *n <= 0 || *k <= 0 || *reps <= 0:
		err = fmt.Errorf("sizes and reps must be positive (-m %d -n %d -k %d -reps %d)", *m, *n, *k, *reps)
	}
	switch {
	case errors.Is(err, flag.ErrHelp):
		usage()
		os.Exit(0)
	case err != nil:
		fmt.Fprintf(os.Stderr, "cublas-sgemm: %v\n", err)
		usage()
		os.Exit(2)
	}
	if err := run(*m, *n, *k, *reps); err != nil {
		fmt.Fprintln(os.Stderr, "cublas-sgemm:", err)
		os.Exit(1)
	}
}

func run(m, n, k, reps int) error {
	if m <= 0 || n <= 0 || k <= 0 || reps <= 0 {
		return fmt.Errorf("sizes and reps must be positive (m=%d n=%d k=%d reps=%d)", m, n, k, reps)
	}
	devs, err := cuda.Devices()
	if err != nil {
		return err // says what failed: no driver, and the paths tried
	}
	if len(devs) == 0 {
		return errors.New("no CUDA devices")
	}
	c, path, err := openCublas()
	if err != nil {
		return err // names the library and the paths tried, and how to add one
	}
	fmt.Printf("cuBLAS: %s\n", path)

	a, b := randMatrix(m*k, 1), randMatrix(k*n, 2)
	want, absSum := cpuSgemm(m, n, k, a, b)

	targets := []*cuda.Device{devs[0]}
	if last := devs[len(devs)-1]; last != devs[0] {
		targets = append(targets, last)
	}
	for _, dev := range targets {
		fs, err := bind(dev, c)
		if err != nil {
			return err
		}
		if err := sgemmOn(dev, c, fs, m, n, k, reps, a, b, want, absSum); err != nil {
			return err
		}
	}
	last := targets[len(targets)-1]
	return last.Do(func() error {
		return sgemmOn(last, c, nil, m, n, k, reps, a, b, want, absSum)
	})
}

// sgemmOn computes C = A*B on dev (column-major, as cuBLAS expects) and
// checks it against want: through fs, or with c's plain functions when fs
// is nil (inside dev.Do).
func sgemmOn(dev *cuda.Device, c *cublas, fs *bound, m, n, k, reps int, a, b, want []float32, absSum []float64) (err error) {
	how := "Device.Foreign"
	if fs == nil {
		how = "Device.Do"
	}
	mr, err := resource.Default(dev)
	if err != nil {
		return err
	}
	s, err := dev.NewStream()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, s.Close()) }()
	alloc := func(elems int) (*buffer.Buffer, error) { return buffer.Allocate(mr, uint64(elems)*4, s) }
	var bufs [3]*buffer.Buffer
	for i, elems := range []int{m * k, k * n, m * n} {
		if bufs[i], err = alloc(elems); err != nil {
			return err
		}
	}
	defer func() {
		for _, buf := range bufs {
			err = errors.Join(err, buf.Close())
		}
	}()
	dA, dB, dC := bufs[0], bufs[1], bufs[2]
	if err := buffer.CopyFromHost(dA, a, s); err != nil {
		return err
	}
	if err := buffer.CopyFromHost(dB, b, s); err != nil {
		return err
	}

	var h uintptr // cublasHandle_t
	var r uintptr
	var cerr error
	if fs != nil {
		r, cerr = fs.create.Call(uintptr(unsafe.Pointer(&h)))
	} else {
		r = c.create.Call(uintptr(unsafe.Pointer(&h)))
	}
	if err := status("cublasCreate_v2", r, cerr); err != nil {
		return fmt.Errorf("%v: %w", dev, err)
	}
	defer func() {
		var r uintptr
		var cerr error
		if fs != nil {
			r, cerr = fs.destroy.Call(h)
		} else {
			r = c.destroy.Call(h)
		}
		err = errors.Join(err, status("cublasDestroy_v2", r, cerr))
	}()
	sh, err := s.HandleErr()
	if err != nil {
		return err
	}
	if fs != nil {
		r, cerr = fs.setStream.Call(h, sh)
	} else {
		r = c.setStream.Call(h, sh)
	}
	if err := status("cublasSetStream_v2", r, cerr); err != nil {
		return err
	}

	alpha, beta := float32(1), float32(0)
	sgemm := func() error {
		// The buffers stay open for the host-side call; the work it queues
		// runs on s, which the buffers were allocated on and are freed on.
		return buffer.Use("cublasSgemm_v2", func(p []cuda.DevicePtr) error {
			pa, pb, pc := uintptr(p[0]), uintptr(p[1]), uintptr(p[2])
			var r uintptr
			var cerr error
			if fs != nil {
				r, cerr = fs.sgemm.Call(h, cublasOpN, cublasOpN, uintptr(m), uintptr(n), uintptr(k),
					uintptr(unsafe.Pointer(&alpha)), pa, uintptr(m), pb, uintptr(k),
					uintptr(unsafe.Pointer(&beta)), pc, uintptr(m))
			} else {
				r = c.sgemm.Call(h, cublasOpN, cublasOpN, uintptr(m), uintptr(n), uintptr(k),
					uintptr(unsafe.Pointer(&alpha)), pa, uintptr(m), pb, uintptr(k),
					uintptr(unsafe.Pointer(&beta)), pc, uintptr(m))
			}
			return status("cublasSgemm_v2", r, cerr)
		}, dA, dB, dC)
	}
	if err := sgemm(); err != nil { // warm-up, and the result checked below
		return err
	}
	if err := s.Sync(); err != nil {
		return err
	}
	start := time.Now()
	for range reps {
		if err := sgemm(); err != nil {
			return err
		}
	}
	if err := s.Sync(); err != nil {
		return err
	}
	elapsed := time.Since(start)

	got := make([]float32, m*n)
	if err := buffer.CopyToHost(got, dC, s); err != nil {
		return err
	}
	if err := s.Sync(); err != nil {
		return err
	}
	worst := 0.0
	for i := range got {
		d := math.Abs(float64(got[i]) - float64(want[i]))
		tol := 1e-4*absSum[i] + 1e-6
		if d > tol {
			return fmt.Errorf("%v (%s): C[%d] = %g, CPU SGEMM says %g (|difference| %g > tolerance %g)", dev, how, i, got[i], want[i], d, tol)
		}
		worst = max(worst, d/(absSum[i]+1e-30))
	}
	gflops := 2 * float64(m) * float64(n) * float64(k) * float64(reps) / elapsed.Seconds() / 1e9
	fmt.Printf("%v via %s: %dx%dx%d SGEMM matches the CPU (worst relative error %.2g), %.0f GFLOP/s over %d runs\n",
		dev, how, m, n, k, worst, gflops, reps)
	return nil
}

func randMatrix(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	out := make([]float32, n)
	for i := range out {
		out[i] = r.Float32()*2 - 1
	}
	return out
}

// cpuSgemm computes C = A*B in column-major order, in float64, and for
// each element the sum of |a|*|b| over k, which bounds float32 rounding.
func cpuSgemm(m, n, k int, a, b []float32) ([]float32, []float64) {
	c := make([]float32, m*n)
	abs := make([]float64, m*n)
	for j := range n {
		for i := range m {
			var sum, sumAbs float64
			for p := range k {
				x, y := float64(a[i+p*m]), float64(b[p+j*k])
				sum += x * y
				sumAbs += math.Abs(x * y)
			}
			c[i+j*m] = float32(sum)
			abs[i+j*m] = sumAbs
		}
	}
	return c, abs
}
