//go:build cgo

// Command cgobench is the C baseline for cudamem's benchmarks: it times raw
// CUDA driver calls made from C, and the same calls made from Go through
// cgo, so the pure-Go (no cgo) path can be compared with both.
//
// It needs cgo to build (CGO_ENABLED=1; a build without cgo fails with
// "build constraints exclude all Go files") but no CUDA headers or
// libraries: it declares the few C types it uses itself and dlopens
// libcuda.so.1 at run time. For the GPU machine, build it from the project
// root with
//
//	../shared/tools/gpu-pack --cgo-bench testdata/cgobench
//
// which runs `CGO_ENABLED=1 go build -o .gpu/bin/cgo-baseline ./testdata/cgobench`,
// then run `.gpu/bin/cgo-baseline` there (carry [".gpu"]).
//
// Usage:
//
//	cgo-baseline [-device N] [-only PREFIX] [-iters X]
//
// -device picks the CUDA device ordinal (default 0), -only runs just the
// measurements whose name starts with PREFIX, and -iters multiplies every
// measurement's default iteration count (default 1; 0.1 for a quick run).
//
// Each measurement prints one JSON object on its own line of stdout:
//
//	{"name":"poolpair/cgo/1MiB","ns_per_op":312.5,"iters":200000}
//	{"name":"copy/dtod","ns_per_op":1.2e5,"gbps":2231.4,"iters":80}
//
// ns_per_op is wall time per iteration; gbps (bytes moved per nanosecond,
// i.e. 1e9 B/s) is given for copies and fills only. The measurements:
//
//   - trivial/c, trivial/cgo: one cuDriverGetVersion per iteration.
//   - poolpair/{c,cgo}/{256B,1MiB,64MiB}: cuMemAllocFromPoolAsync +
//     cuMemFreeAsync on the device's default pool (release threshold set to
//     UINT64_MAX) on a non-blocking stream; warmed up first, and the final
//     cuStreamSynchronize is inside the timed span.
//   - copy/htod_pinned, copy/dtoh_pinned: cuMemcpy{HtoD,DtoH}Async_v2 of
//     256 MiB to/from cuMemAllocHost memory on the stream.
//   - copy/dtod: cuMemcpyDtoDAsync_v2 of 256 MiB; fill/d32: cuMemsetD32Async
//     over 256 MiB.
//   - copy/htod_pageable, copy/dtoh_pageable: synchronous cuMemcpy{HtoD,DtoH}_v2
//     of 256 MiB to/from malloc'd memory.
//
// Copies and fills end with cuStreamSynchronize and cuCtxSynchronize inside
// the timed span, after one untimed warm-up operation.
//
// In the */c variants the whole timed loop runs in C and is timed with
// clock_gettime(CLOCK_MONOTONIC). In the */cgo variants the loop is in Go
// and every driver call is one cgo call to a small C wrapper that calls the
// driver's function pointer, as a cgo binding would (so poolpair/cgo makes
// two cgo calls per iteration, one per driver call). Out-parameters of the
// wrapped calls live in C memory, so the Go loops do not allocate.
//
// Every CUresult is checked; on failure the program prints the failing call
// and the error's name to stderr and exits with status 1.
package main

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// Plain C stand-ins for the driver's types (no CUDA headers at build time).
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef unsigned long long CUdeviceptr;

enum {
	CB_STREAM_NON_BLOCKING = 1,            // CU_STREAM_NON_BLOCKING
	CB_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4, // CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
};

static CUresult (*cb_cuGetErrorName)(CUresult, const char **);
static CUresult (*cb_cuInit)(unsigned int);
static CUresult (*cb_cuDriverGetVersion)(int *);
static CUresult (*cb_cuDeviceGet)(CUdevice *, int);
static CUresult (*cb_cuDevicePrimaryCtxRetain)(CUcontext *, CUdevice);
static CUresult (*cb_cuDevicePrimaryCtxRelease)(CUdevice);
static CUresult (*cb_cuCtxSetCurrent)(CUcontext);
static CUresult (*cb_cuCtxSynchronize)(void);
static CUresult (*cb_cuStreamCreate)(CUstream *, unsigned int);
static CUresult (*cb_cuStreamDestroy)(CUstream);
static CUresult (*cb_cuStreamSynchronize)(CUstream);
static CUresult (*cb_cuDeviceGetDefaultMemPool)(CUmemoryPool *, CUdevice);
static CUresult (*cb_cuMemPoolSetAttribute)(CUmemoryPool, int, void *);
static CUresult (*cb_cuMemAllocFromPoolAsync)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
static CUresult (*cb_cuMemFreeAsync)(CUdeviceptr, CUstream);
static CUresult (*cb_cuMemAlloc)(CUdeviceptr *, size_t);
static CUresult (*cb_cuMemFree)(CUdeviceptr);
static CUresult (*cb_cuMemAllocHost)(void **, size_t);
static CUresult (*cb_cuMemFreeHost)(void *);
static CUresult (*cb_cuMemcpyHtoD)(CUdeviceptr, const void *, size_t);
static CUresult (*cb_cuMemcpyDtoH)(void *, CUdeviceptr, size_t);
static CUresult (*cb_cuMemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
static CUresult (*cb_cuMemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
static CUresult (*cb_cuMemcpyDtoDAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
static CUresult (*cb_cuMemsetD32Async)(CUdeviceptr, unsigned int, size_t, CUstream);

static char cb_errbuf[512];

// cb_load dlopens the driver and resolves every symbol; it returns NULL or a message.
static const char *cb_load(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		snprintf(cb_errbuf, sizeof cb_errbuf, "dlopen libcuda.so.1: %s", e ? e : "unknown error");
		return cb_errbuf;
	}
	struct { void **slot; const char *name; } syms[] = {
		{(void **)&cb_cuGetErrorName, "cuGetErrorName"},
		{(void **)&cb_cuInit, "cuInit"},
		{(void **)&cb_cuDriverGetVersion, "cuDriverGetVersion"},
		{(void **)&cb_cuDeviceGet, "cuDeviceGet"},
		{(void **)&cb_cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
		{(void **)&cb_cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
		{(void **)&cb_cuCtxSetCurrent, "cuCtxSetCurrent"},
		{(void **)&cb_cuCtxSynchronize, "cuCtxSynchronize"},
		{(void **)&cb_cuStreamCreate, "cuStreamCreate"},
		{(void **)&cb_cuStreamDestroy, "cuStreamDestroy_v2"},
		{(void **)&cb_cuStreamSynchronize, "cuStreamSynchronize"},
		{(void **)&cb_cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool"},
		{(void **)&cb_cuMemPoolSetAttribute, "cuMemPoolSetAttribute"},
		{(void **)&cb_cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync"},
		{(void **)&cb_cuMemFreeAsync, "cuMemFreeAsync"},
		{(void **)&cb_cuMemAlloc, "cuMemAlloc_v2"},
		{(void **)&cb_cuMemFree, "cuMemFree_v2"},
		{(void **)&cb_cuMemAllocHost, "cuMemAllocHost_v2"},
		{(void **)&cb_cuMemFreeHost, "cuMemFreeHost"},
		{(void **)&cb_cuMemcpyHtoD, "cuMemcpyHtoD_v2"},
		{(void **)&cb_cuMemcpyDtoH, "cuMemcpyDtoH_v2"},
		{(void **)&cb_cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"},
		{(void **)&cb_cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"},
		{(void **)&cb_cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"},
		{(void **)&cb_cuMemsetD32Async, "cuMemsetD32Async"},
	};
	for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
		dlerror();
		void *p = dlsym(h, syms[i].name);
		if (p == NULL) {
			const char *e = dlerror();
			snprintf(cb_errbuf, sizeof cb_errbuf, "dlsym %s: %s", syms[i].name, e ? e : "symbol is NULL");
			return cb_errbuf;
		}
		*syms[i].slot = p;
	}
	return NULL;
}

static const char *cb_error_name(CUresult r) {
	const char *s = NULL;
	if (cb_cuGetErrorName != NULL && cb_cuGetErrorName(r, &s) == 0 && s != NULL) {
		return s;
	}
	return "unknown CUresult";
}

// cb_failed names the driver call behind the last non-zero CUresult a C helper returned.
static const char *cb_failed = "";

#define CB_CK(name, call) do { CUresult r_ = (call); if (r_ != 0) { cb_failed = (name); return r_; } } while (0)

static double cb_now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static CUdevice cb_dev;
static CUcontext cb_ctx;
static CUstream cb_stream;
static CUmemoryPool cb_pool;

static CUresult cb_setup(int ordinal) {
	CB_CK("cuInit", cb_cuInit(0));
	CB_CK("cuDeviceGet", cb_cuDeviceGet(&cb_dev, ordinal));
	CB_CK("cuDevicePrimaryCtxRetain", cb_cuDevicePrimaryCtxRetain(&cb_ctx, cb_dev));
	CB_CK("cuCtxSetCurrent", cb_cuCtxSetCurrent(cb_ctx));
	CB_CK("cuStreamCreate", cb_cuStreamCreate(&cb_stream, CB_STREAM_NON_BLOCKING));
	CB_CK("cuDeviceGetDefaultMemPool", cb_cuDeviceGetDefaultMemPool(&cb_pool, cb_dev));
	uint64_t thr = UINT64_MAX;
	CB_CK("cuMemPoolSetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)",
		cb_cuMemPoolSetAttribute(cb_pool, CB_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
	return 0;
}

static CUresult cb_teardown(void) {
	CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_stream));
	CB_CK("cuStreamDestroy_v2", cb_cuStreamDestroy(cb_stream));
	CB_CK("cuDevicePrimaryCtxRelease_v2", cb_cuDevicePrimaryCtxRelease(cb_dev));
	return 0;
}

// ---- loops in C ----

static CUresult cb_trivial_c(long long n, double *ns) {
	int v;
	double t0 = cb_now();
	for (long long i = 0; i < n; i++) {
		CB_CK("cuDriverGetVersion", cb_cuDriverGetVersion(&v));
	}
	*ns = cb_now() - t0;
	return 0;
}

static CUresult cb_poolpair_c(size_t size, long long warm, long long n, double *ns) {
	CUdeviceptr p;
	for (long long i = 0; i < warm; i++) {
		CB_CK("cuMemAllocFromPoolAsync", cb_cuMemAllocFromPoolAsync(&p, size, cb_pool, cb_stream));
		CB_CK("cuMemFreeAsync", cb_cuMemFreeAsync(p, cb_stream));
	}
	CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_stream));
	double t0 = cb_now();
	for (long long i = 0; i < n; i++) {
		CB_CK("cuMemAllocFromPoolAsync", cb_cuMemAllocFromPoolAsync(&p, size, cb_pool, cb_stream));
		CB_CK("cuMemFreeAsync", cb_cuMemFreeAsync(p, cb_stream));
	}
	CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_stream));
	*ns = cb_now() - t0;
	return 0;
}

enum { CB_HTOD_PINNED, CB_DTOH_PINNED, CB_DTOD, CB_FILL_D32, CB_HTOD_PAGEABLE, CB_DTOH_PAGEABLE };

static size_t cb_bytes;
static CUdeviceptr cb_d0, cb_d1;
static void *cb_pinned, *cb_pageable;

static CUresult cb_copy_setup(size_t bytes) {
	cb_bytes = bytes;
	CB_CK("cuMemAlloc_v2", cb_cuMemAlloc(&cb_d0, bytes));
	CB_CK("cuMemAlloc_v2", cb_cuMemAlloc(&cb_d1, bytes));
	CB_CK("cuMemAllocHost_v2", cb_cuMemAllocHost(&cb_pinned, bytes));
	cb_pageable = malloc(bytes);
	if (cb_pageable == NULL) {
		cb_failed = "malloc";
		return 2; // CUDA_ERROR_OUT_OF_MEMORY
	}
	memset(cb_pinned, 1, bytes);
	memset(cb_pageable, 1, bytes);
	CB_CK("cuMemsetD32Async", cb_cuMemsetD32Async(cb_d0, 7, bytes / 4, cb_stream));
	CB_CK("cuMemsetD32Async", cb_cuMemsetD32Async(cb_d1, 7, bytes / 4, cb_stream));
	CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_stream));
	return 0;
}

static CUresult cb_copy_teardown(void) {
	CB_CK("cuCtxSynchronize", cb_cuCtxSynchronize());
	CB_CK("cuMemFree_v2", cb_cuMemFree(cb_d0));
	CB_CK("cuMemFree_v2", cb_cuMemFree(cb_d1));
	CB_CK("cuMemFreeHost", cb_cuMemFreeHost(cb_pinned));
	free(cb_pageable);
	return 0;
}

static CUresult cb_copy_once(int kind) {
	switch (kind) {
	case CB_HTOD_PINNED:
		CB_CK("cuMemcpyHtoDAsync_v2", cb_cuMemcpyHtoDAsync(cb_d0, cb_pinned, cb_bytes, cb_stream));
		break;
	case CB_DTOH_PINNED:
		CB_CK("cuMemcpyDtoHAsync_v2", cb_cuMemcpyDtoHAsync(cb_pinned, cb_d0, cb_bytes, cb_stream));
		break;
	case CB_DTOD:
		CB_CK("cuMemcpyDtoDAsync_v2", cb_cuMemcpyDtoDAsync(cb_d1, cb_d0, cb_bytes, cb_stream));
		break;
	case CB_FILL_D32:
		CB_CK("cuMemsetD32Async", cb_cuMemsetD32Async(cb_d0, 7, cb_bytes / 4, cb_stream));
		break;
	case CB_HTOD_PAGEABLE:
		CB_CK("cuMemcpyHtoD_v2", cb_cuMemcpyHtoD(cb_d0, cb_pageable, cb_bytes));
		break;
	case CB_DTOH_PAGEABLE:
		CB_CK("cuMemcpyDtoH_v2", cb_cuMemcpyDtoH(cb_pageable, cb_d0, cb_bytes));
		break;
	default:
		cb_failed = "cb_copy_once: unknown kind";
		return 1; // CUDA_ERROR_INVALID_VALUE
	}
	return 0;
}

static CUresult cb_copy_c(int kind, long long n, double *ns) {
	CUresult r = cb_copy_once(kind); // warm-up
	if (r != 0) {
		return r;
	}
	CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_stream));
	CB_CK("cuCtxSynchronize", cb_cuCtxSynchronize());
	double t0 = cb_now();
	for (long long i = 0; i < n; i++) {
		r = cb_copy_once(kind);
		if (r != 0) {
			return r;
		}
	}
	CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_stream));
	CB_CK("cuCtxSynchronize", cb_cuCtxSynchronize());
	*ns = cb_now() - t0;
	return 0;
}

static const char *cb_failed_call(void) { return cb_failed; }
static CUmemoryPool cb_get_pool(void) { return cb_pool; }
static CUstream cb_get_stream(void) { return cb_stream; }

// ---- one-call wrappers for loops in Go (one cgo call per driver call) ----

static CUresult cb_call_driver_get_version(int *v) {
	return cb_cuDriverGetVersion(v);
}

static CUresult cb_call_mem_alloc_from_pool_async(CUdeviceptr *p, size_t size, CUmemoryPool pool, CUstream s) {
	return cb_cuMemAllocFromPoolAsync(p, size, pool, s);
}

static CUresult cb_call_mem_free_async(CUdeviceptr p, CUstream s) {
	return cb_cuMemFreeAsync(p, s);
}

static CUresult cb_call_stream_synchronize(CUstream s) {
	return cb_cuStreamSynchronize(s);
}
*/
import "C"

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"time"
	"unsafe"
)

// The primary context is made current on one OS thread; keep main's goroutine on it.
func init() { runtime.LockOSThread() }

const (
	copyBytes = 256 << 20
	poolWarm  = 1000
)

type result struct {
	Name    string  `json:"name"`
	NsPerOp float64 `json:"ns_per_op"`
	GBps    float64 `json:"gbps,omitempty"`
	Iters   int64   `json:"iters"`
}

type measurement struct {
	name    string
	iters   int64 // default count, scaled by -iters
	bytes   int64 // bytes moved per iteration; 0 for calls that move none
	context bool  // needs the context, stream and pool
	buffers bool  // needs the copy buffers
	run     func(n int64) float64
}

func fail(call string, r C.CUresult) {
	fmt.Fprintf(os.Stderr, "cgo-baseline: %s failed: %s (CUresult %d)\n", call, C.GoString(C.cb_error_name(r)), int(r))
	os.Exit(1)
}

// checkC reports a failure from a C helper, which names the call in cb_failed.
func checkC(r C.CUresult) {
	if r != 0 {
		fail(C.GoString(C.cb_failed_call()), r)
	}
}

func main() {
	device := flag.Int("device", 0, "CUDA device ordinal")
	only := flag.String("only", "", "run only measurements whose name starts with `PREFIX`")
	scale := flag.Float64("iters", 1, "multiply every measurement's default iteration count by `X`")
	flag.Parse()
	if flag.NArg() != 0 || *scale <= 0 || math.IsInf(*scale, 0) || math.IsNaN(*scale) {
		flag.Usage()
		os.Exit(2)
	}

	var ms []measurement
	for _, m := range measurements() {
		if strings.HasPrefix(m.name, *only) {
			ms = append(ms, m)
		}
	}
	if len(ms) == 0 {
		fmt.Fprintf(os.Stderr, "cgo-baseline: no measurement name starts with %q\n", *only)
		os.Exit(2)
	}

	if msg := C.cb_load(); msg != nil {
		fmt.Fprintf(os.Stderr, "cgo-baseline: %s\n", C.GoString(msg))
		os.Exit(1)
	}

	needContext, needBuffers := false, false
	for _, m := range ms {
		needContext = needContext || m.context
		needBuffers = needBuffers || m.buffers
	}
	if needContext {
		checkC(C.cb_setup(C.int(*device)))
	}
	if needBuffers {
		checkC(C.cb_copy_setup(copyBytes))
	}

	enc := json.NewEncoder(os.Stdout)
	for _, m := range ms {
		n := int64(math.Round(float64(m.iters) * *scale))
		if n < 1 {
			n = 1
		}
		ns := m.run(n)
		res := result{Name: m.name, NsPerOp: ns / float64(n), Iters: n}
		if m.bytes > 0 && ns > 0 {
			res.GBps = float64(m.bytes) * float64(n) / ns
		}
		if err := enc.Encode(res); err != nil {
			fmt.Fprintf(os.Stderr, "cgo-baseline: %v\n", err)
			os.Exit(1)
		}
	}

	if needBuffers {
		checkC(C.cb_copy_teardown())
	}
	if needContext {
		checkC(C.cb_teardown())
	}
}

func measurements() []measurement {
	ms := []measurement{
		{name: "trivial/c", iters: 1_000_000, run: trivialC},
		{name: "trivial/cgo", iters: 1_000_000, run: trivialCgo},
	}
	for _, sz := range []struct {
		label string
		bytes int64
	}{{"256B", 256}, {"1MiB", 1 << 20}, {"64MiB", 64 << 20}} {
		size := C.size_t(sz.bytes)
		ms = append(ms,
			measurement{name: "poolpair/c/" + sz.label, iters: 200_000, context: true,
				run: func(n int64) float64 { return poolpairC(size, n) }},
			measurement{name: "poolpair/cgo/" + sz.label, iters: 200_000, context: true,
				run: func(n int64) float64 { return poolpairCgo(size, n) }},
		)
	}
	for _, c := range []struct {
		name  string
		kind  C.int
		iters int64
	}{
		{"copy/htod_pinned", C.CB_HTOD_PINNED, 20},
		{"copy/dtoh_pinned", C.CB_DTOH_PINNED, 20},
		{"copy/dtod", C.CB_DTOD, 80},
		{"fill/d32", C.CB_FILL_D32, 80},
		{"copy/htod_pageable", C.CB_HTOD_PAGEABLE, 20},
		{"copy/dtoh_pageable", C.CB_DTOH_PAGEABLE, 20},
	} {
		kind := c.kind
		ms = append(ms, measurement{name: c.name, iters: c.iters, bytes: copyBytes, context: true, buffers: true,
			run: func(n int64) float64 { return copyC(kind, n) }})
	}
	return ms
}

func trivialC(n int64) float64 {
	var ns C.double
	checkC(C.cb_trivial_c(C.longlong(n), &ns))
	return float64(ns)
}

func trivialCgo(n int64) float64 {
	v := (*C.int)(C.malloc(C.size_t(unsafe.Sizeof(C.int(0)))))
	defer C.free(unsafe.Pointer(v))
	t0 := time.Now()
	for i := int64(0); i < n; i++ {
		if r := C.cb_call_driver_get_version(v); r != 0 {
			fail("cuDriverGetVersion", r)
		}
	}
	return float64(time.Since(t0).Nanoseconds())
}

func poolpairC(size C.size_t, n int64) float64 {
	var ns C.double
	checkC(C.cb_poolpair_c(size, poolWarm, C.longlong(n), &ns))
	return float64(ns)
}

func poolpairCgo(size C.size_t, n int64) float64 {
	p := (*C.CUdeviceptr)(C.malloc(C.size_t(unsafe.Sizeof(C.CUdeviceptr(0)))))
	defer C.free(unsafe.Pointer(p))
	pool, stream := C.cb_get_pool(), C.cb_get_stream()
	pair := func() {
		if r := C.cb_call_mem_alloc_from_pool_async(p, size, pool, stream); r != 0 {
			fail("cuMemAllocFromPoolAsync", r)
		}
		if r := C.cb_call_mem_free_async(*p, stream); r != 0 {
			fail("cuMemFreeAsync", r)
		}
	}
	for i := 0; i < poolWarm; i++ {
		pair()
	}
	if r := C.cb_call_stream_synchronize(stream); r != 0 {
		fail("cuStreamSynchronize", r)
	}
	t0 := time.Now()
	for i := int64(0); i < n; i++ {
		if r := C.cb_call_mem_alloc_from_pool_async(p, size, pool, stream); r != 0 {
			fail("cuMemAllocFromPoolAsync", r)
		}
		if r := C.cb_call_mem_free_async(*p, stream); r != 0 {
			fail("cuMemFreeAsync", r)
		}
	}
	if r := C.cb_call_stream_synchronize(stream); r != 0 {
		fail("cuStreamSynchronize", r)
	}
	return float64(time.Since(t0).Nanoseconds())
}

func copyC(kind C.int, n int64) float64 {
	var ns C.double
	checkC(C.cb_copy_c(kind, C.longlong(n), &ns))
	return float64(ns)
}
