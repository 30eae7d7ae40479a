//go:build cgo

// Command cgobench is the C baseline for cudamem's benchmarks: it times raw
// CUDA driver calls made from C, and the same calls made from Go through
// cgo, so the pure-Go (no cgo) path can be compared with both.
//
// It needs cgo to build (CGO_ENABLED=1; a build without cgo fails with
// "build constraints exclude all Go files") but no CUDA headers or
// libraries: it declares the few C types it uses itself and dlopens
// libcuda.so.1 at run time. Build it from the repository's root with
//
//	CGO_ENABLED=1 go build -o cgo-baseline ./testdata/cgobench
//
// and put it beside the cudamem binary (or pass cudamem bench -cgo PATH);
// scripts/gpu-pack --cgo-bench testdata/cgobench builds it as
// .gpu/bin/cgo-baseline, beside .gpu/bin/cudamem, for a GPU machine.
//
// Usage:
//
//	cgo-baseline [-device N] [-only PREFIX] [-names LIST] [-iters X] [-count N] [-grow-to BYTES] [-serve]
//
// -device picks the CUDA device ordinal (default 0), -only runs just the
// measurements whose name starts with PREFIX, -names just those named in
// the comma-separated LIST (cudamem bench passes the baselines of what it
// measured), -iters multiplies every measurement's default iteration
// count (default 1; 0.1 for a quick run), -count repeats each measurement
// N times (one line per repetition, numbered by "rep"), and -grow-to sets
// the size vmm/growstep grows to (default 8 GiB). With -serve it sets up
// what the selection needs, then runs one repetition of the measurement
// named on each line of its stdin and answers with its JSON lines and an
// empty line: cudamem bench alternates its own repetitions with these.
// Progress goes to
// stderr, one line per measurement started, and so do skips (a
// measurement that needs more device memory than is free, or a feature
// the driver lacks, is reported and left out).
//
// Each measurement prints one JSON object per repetition on its own line of stdout:
//
//	{"name":"poolpair/cgo/1MiB","ns_per_op":312.5,"iters":200000,"rep":1}
//	{"name":"copy/dtod","ns_per_op":1.2e5,"gbps":2231.4,"iters":80,"rep":1}
//
// ns_per_op is wall time per operation; gbps (bytes moved per nanosecond,
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
//   - poolpair/hostpool/c/1MiB: the pool pair on a pinned host pool
//     (cuMemPoolCreate with a CU_MEM_LOCATION_TYPE_HOST location, release
//     threshold UINT64_MAX); skipped where the driver has no host pools.
//     poolpair/hostpool_rw/c/1MiB: the same on a second such pool whose
//     memory the device may read and write (cuMemPoolSetAccess), as
//     resource.PinnedPool grants.
//   - ipc/pool_create_export/c: per iteration cuMemPoolCreate (POSIX-fd
//     handle type, device location), release threshold, export to an fd,
//     allocate 1 MiB, cuStreamSynchronize, cuMemPoolExportPointer,
//     cuMemFreeAsync, close the fd, cuCtxSynchronize, cuMemPoolDestroy:
//     the driver calls cudamem's NewDevicePool(IPC) + ExportPool +
//     Allocate + ExportBuffer + three Closes make.
//   - ipc/child_import/c and ipc/child_init/c: the program re-executes
//     itself (hidden first argument -ipc-child) once per iteration with an
//     exported pool's fd as fd 3 (exec.Cmd.ExtraFiles) and a 1 MiB
//     buffer's export data in its environment. The child times, in C,
//     cuMemPoolImportFromShareableHandle + cuMemPoolImportPointer
//     (child_import), after loading the driver, cuInit and making the
//     primary context current (child_init, timed from the child's main);
//     it reads the first 4 bytes back with cuMemcpyDtoH and the parent
//     checks them. ipc/child_import/again/c: each child does all that
//     once untimed and times a second import, the cost of an import
//     with the process's first-time work behind it.
//   - vmm/allocfree/c/{2MiB,64MiB,1GiB,16GiB}: cuMemAddressReserve
//     (aligned to the granularity), cuMemCreate (pinned device memory,
//     POSIX-fd handle type), cuMemMap, cuMemSetAccess (read-write), then
//     cuStreamSynchronize of the idle stream (virtual.Resource's Close
//     waits for the buffer's stream), cuMemUnmap, cuMemRelease,
//     cuMemAddressFree. Sizes that do not fit in free device memory (with
//     1 GiB to spare) are skipped.
//   - vmm/growstep/c/toSIZE/first16 and .../last16: one reservation of
//     -grow-to bytes filled by 2 MiB chunks (cuMemCreate + cuMemMap +
//     cuMemSetAccess each; the first chunk untimed), reporting the time
//     per step of the first 16 and of the last 16 steps.
//   - poolpair/mt/c/{1,4,16,64}/{own,shared}: the 256 B pool pair from
//     that many pthreads (20,000, 20,000, 8,000 and 2,000 pairs each), each
//     on a stream of its own or all on one, on the default pool; the
//     threads start together at a barrier and ns_per_op is the wall time
//     until the last is joined, per pair of all threads (1e9/ns_per_op is
//     pairs per second).
//   - batch/{htod,dtod}/{c_batched,c_loop}: 10,000 copies of 4 KiB per
//     iteration, block i of a pinned (htod) or device (dtod) source to
//     block i*7919 mod 10,000 of a device destination, on the stream:
//     c_batched as one cuMemcpyBatchAsync_v2 (cuMemcpyBatchAsync, the CUDA
//     12.8 ABI, on 12.8 and 12.9 drivers; skipped before 12.8) with one
//     stream-ordered attribute, c_loop as one cuMemcpyAsync per copy.
//     ns_per_op is per copy (1e9/ns_per_op is copies per second); the
//     stream is synchronized once, after the last iteration, inside the
//     timed span, after one untimed batch.
//
// Copies and fills end with cuStreamSynchronize and cuCtxSynchronize inside
// the timed span, after one untimed warm-up operation. The IPC, VMM and
// thread measurements run a tenth of their iterations untimed first.
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
#cgo LDFLAGS: -ldl -lpthread
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>
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
typedef unsigned long long CUmemGenericAllocationHandle;

enum {
	CB_STREAM_NON_BLOCKING = 1,            // CU_STREAM_NON_BLOCKING
	CB_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4, // CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
	CB_MEM_ALLOCATION_TYPE_PINNED = 1,     // CU_MEM_ALLOCATION_TYPE_PINNED
	CB_MEM_LOCATION_TYPE_DEVICE = 1,       // CU_MEM_LOCATION_TYPE_DEVICE
	CB_MEM_LOCATION_TYPE_HOST = 2,         // CU_MEM_LOCATION_TYPE_HOST
	CB_MEM_HANDLE_TYPE_POSIX_FD = 1,       // CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
	CB_MEM_ACCESS_PROT_READWRITE = 3,      // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	CB_MEM_ALLOC_GRANULARITY_RECOMMENDED = 1,
};

// Layouts of CUmemLocation, CUmemPoolProps, CUmemAllocationProp,
// CUmemAccessDesc and CUmemPoolPtrExportData (enums are int-sized).
typedef struct { int type; int id; } CBmemLocation;
typedef struct {
	int allocType;
	int handleTypes;
	CBmemLocation location;
	void *win32SecurityAttributes;
	size_t maxSize;
	unsigned short usage;
	unsigned char reserved[54];
} CBmemPoolProps;
typedef struct {
	int type;
	int requestedHandleTypes;
	CBmemLocation location;
	void *win32HandleMetaData;
	struct {
		unsigned char compressionType;
		unsigned char gpuDirectRDMACapable;
		unsigned short usage;
		unsigned char reserved[4];
	} allocFlags;
} CBmemAllocationProp;
typedef struct { CBmemLocation location; int flags; } CBmemAccessDesc;
typedef struct { unsigned char reserved[64]; } CBmemPoolPtrExportData;

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
static CUresult (*cb_cuMemPoolSetAccess)(CUmemoryPool, const CBmemAccessDesc *, size_t);
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
static CUresult (*cb_cuMemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
static CUresult (*cb_cuMemGetInfo)(size_t *, size_t *);
static CUresult (*cb_cuMemPoolCreate)(CUmemoryPool *, const CBmemPoolProps *);
static CUresult (*cb_cuMemPoolDestroy)(CUmemoryPool);
static CUresult (*cb_cuMemPoolExportToShareableHandle)(void *, CUmemoryPool, int, unsigned long long);
static CUresult (*cb_cuMemPoolImportFromShareableHandle)(CUmemoryPool *, void *, int, unsigned long long);
static CUresult (*cb_cuMemPoolExportPointer)(CBmemPoolPtrExportData *, CUdeviceptr);
static CUresult (*cb_cuMemPoolImportPointer)(CUdeviceptr *, CUmemoryPool, CBmemPoolPtrExportData *);
static CUresult (*cb_cuMemGetAllocationGranularity)(size_t *, const CBmemAllocationProp *, int);
static CUresult (*cb_cuMemCreate)(CUmemGenericAllocationHandle *, size_t, const CBmemAllocationProp *, unsigned long long);
static CUresult (*cb_cuMemRelease)(CUmemGenericAllocationHandle);
static CUresult (*cb_cuMemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
static CUresult (*cb_cuMemAddressFree)(CUdeviceptr, size_t);
static CUresult (*cb_cuMemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
static CUresult (*cb_cuMemUnmap)(CUdeviceptr, size_t);
static CUresult (*cb_cuMemSetAccess)(CUdeviceptr, size_t, const CBmemAccessDesc *, size_t);

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
		{(void **)&cb_cuMemPoolSetAccess, "cuMemPoolSetAccess"},
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
		{(void **)&cb_cuMemsetD8Async, "cuMemsetD8Async"},
		{(void **)&cb_cuMemGetInfo, "cuMemGetInfo_v2"},
		{(void **)&cb_cuMemPoolCreate, "cuMemPoolCreate"},
		{(void **)&cb_cuMemPoolDestroy, "cuMemPoolDestroy"},
		{(void **)&cb_cuMemPoolExportToShareableHandle, "cuMemPoolExportToShareableHandle"},
		{(void **)&cb_cuMemPoolImportFromShareableHandle, "cuMemPoolImportFromShareableHandle"},
		{(void **)&cb_cuMemPoolExportPointer, "cuMemPoolExportPointer"},
		{(void **)&cb_cuMemPoolImportPointer, "cuMemPoolImportPointer"},
		{(void **)&cb_cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity"},
		{(void **)&cb_cuMemCreate, "cuMemCreate"},
		{(void **)&cb_cuMemRelease, "cuMemRelease"},
		{(void **)&cb_cuMemAddressReserve, "cuMemAddressReserve"},
		{(void **)&cb_cuMemAddressFree, "cuMemAddressFree"},
		{(void **)&cb_cuMemMap, "cuMemMap"},
		{(void **)&cb_cuMemUnmap, "cuMemUnmap"},
		{(void **)&cb_cuMemSetAccess, "cuMemSetAccess"},
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

static CUresult cb_poolpair_on(CUmemoryPool pool, size_t size, long long warm, long long n, double *ns) {
	CUdeviceptr p;
	for (long long i = 0; i < warm; i++) {
		CB_CK("cuMemAllocFromPoolAsync", cb_cuMemAllocFromPoolAsync(&p, size, pool, cb_stream));
		CB_CK("cuMemFreeAsync", cb_cuMemFreeAsync(p, cb_stream));
	}
	CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_stream));
	double t0 = cb_now();
	for (long long i = 0; i < n; i++) {
		CB_CK("cuMemAllocFromPoolAsync", cb_cuMemAllocFromPoolAsync(&p, size, pool, cb_stream));
		CB_CK("cuMemFreeAsync", cb_cuMemFreeAsync(p, cb_stream));
	}
	CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_stream));
	*ns = cb_now() - t0;
	return 0;
}

static CUresult cb_poolpair_c(size_t size, long long warm, long long n, double *ns) {
	return cb_poolpair_on(cb_pool, size, warm, n, ns);
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

static CUresult cb_mem_free(size_t *free_bytes) {
	size_t total;
	CB_CK("cuMemGetInfo_v2", cb_cuMemGetInfo(free_bytes, &total));
	return 0;
}

// ---- IPC: pools exported as POSIX file descriptors ----

static CBmemPoolProps cb_ipc_props(void) {
	CBmemPoolProps pp;
	memset(&pp, 0, sizeof pp);
	pp.allocType = CB_MEM_ALLOCATION_TYPE_PINNED;
	pp.handleTypes = CB_MEM_HANDLE_TYPE_POSIX_FD;
	pp.location.type = CB_MEM_LOCATION_TYPE_DEVICE;
	pp.location.id = cb_dev;
	return pp;
}

// cb_ipc_pool_create_export makes the driver calls cudamem's
// resource.NewDevicePool(IPC) + ipc.ExportPool + Allocate + ipc.ExportBuffer
// + Close of all three make: create, release threshold, export to an fd,
// allocate 1 MiB, wait for the stream, export the pointer, free, close the
// fd, synchronize the context, destroy.
static CUresult cb_ipc_pool_create_export(long long n, double *ns) {
	CBmemPoolProps pp = cb_ipc_props();
	uint64_t thr = UINT64_MAX;
	double t0 = cb_now();
	for (long long i = 0; i < n; i++) {
		CUmemoryPool mp;
		CB_CK("cuMemPoolCreate", cb_cuMemPoolCreate(&mp, &pp));
		CB_CK("cuMemPoolSetAttribute", cb_cuMemPoolSetAttribute(mp, CB_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr));
		int fd = -1;
		CB_CK("cuMemPoolExportToShareableHandle", cb_cuMemPoolExportToShareableHandle(&fd, mp, CB_MEM_HANDLE_TYPE_POSIX_FD, 0));
		CUdeviceptr p;
		CB_CK("cuMemAllocFromPoolAsync", cb_cuMemAllocFromPoolAsync(&p, 1 << 20, mp, cb_stream));
		CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_stream));
		CBmemPoolPtrExportData ed;
		CB_CK("cuMemPoolExportPointer", cb_cuMemPoolExportPointer(&ed, p));
		CB_CK("cuMemFreeAsync", cb_cuMemFreeAsync(p, cb_stream));
		if (close(fd) != 0) {
			cb_failed = "close";
			return 999; // CUDA_ERROR_UNKNOWN
		}
		CB_CK("cuCtxSynchronize", cb_cuCtxSynchronize());
		CB_CK("cuMemPoolDestroy", cb_cuMemPoolDestroy(mp));
	}
	*ns = cb_now() - t0;
	return 0;
}

static CUmemoryPool cb_ipc_pool;
static CUdeviceptr cb_ipc_ptr;

// cb_ipc_parent_setup makes the pool and the 1 MiB buffer (filled with
// fill) that the children of ipc/child_import import.
static CUresult cb_ipc_parent_setup(unsigned char fill, int *fd, unsigned char *export_data) {
	CBmemPoolProps pp = cb_ipc_props();
	CB_CK("cuMemPoolCreate", cb_cuMemPoolCreate(&cb_ipc_pool, &pp));
	CB_CK("cuMemPoolExportToShareableHandle", cb_cuMemPoolExportToShareableHandle(fd, cb_ipc_pool, CB_MEM_HANDLE_TYPE_POSIX_FD, 0));
	CB_CK("cuMemAllocFromPoolAsync", cb_cuMemAllocFromPoolAsync(&cb_ipc_ptr, 1 << 20, cb_ipc_pool, cb_stream));
	CB_CK("cuMemsetD8Async", cb_cuMemsetD8Async(cb_ipc_ptr, fill, 1 << 20, cb_stream));
	CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_stream));
	CBmemPoolPtrExportData ed;
	CB_CK("cuMemPoolExportPointer", cb_cuMemPoolExportPointer(&ed, cb_ipc_ptr));
	memcpy(export_data, ed.reserved, 64);
	return 0;
}

static CUresult cb_ipc_parent_teardown(void) {
	CB_CK("cuMemFreeAsync", cb_cuMemFreeAsync(cb_ipc_ptr, cb_stream));
	CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_stream));
	CB_CK("cuMemPoolDestroy", cb_cuMemPoolDestroy(cb_ipc_pool));
	return 0;
}

// cb_child_init is what a new process does before it can import: cuInit
// and the primary context (after the driver is loaded).
static CUresult cb_child_init(int ordinal) {
	CB_CK("cuInit", cb_cuInit(0));
	CB_CK("cuDeviceGet", cb_cuDeviceGet(&cb_dev, ordinal));
	CB_CK("cuDevicePrimaryCtxRetain", cb_cuDevicePrimaryCtxRetain(&cb_ctx, cb_dev));
	CB_CK("cuCtxSetCurrent", cb_cuCtxSetCurrent(cb_ctx));
	return 0;
}

// cb_ipc_child imports the pool from fd and the pointer from its export
// data (timed), then reads the first 4 bytes back and lets go of both.
static CUresult cb_ipc_child(int fd, const unsigned char *export_data, double *ns, unsigned char *first) {
	CBmemPoolPtrExportData ed;
	memcpy(ed.reserved, export_data, 64);
	double t0 = cb_now();
	CUmemoryPool mp;
	CB_CK("cuMemPoolImportFromShareableHandle",
		cb_cuMemPoolImportFromShareableHandle(&mp, (void *)(intptr_t)fd, CB_MEM_HANDLE_TYPE_POSIX_FD, 0));
	CUdeviceptr p;
	CB_CK("cuMemPoolImportPointer", cb_cuMemPoolImportPointer(&p, mp, &ed));
	*ns = cb_now() - t0;
	CB_CK("cuMemcpyDtoH_v2", cb_cuMemcpyDtoH(first, p, 4));
	CB_CK("cuMemFree_v2", cb_cuMemFree(p));
	CB_CK("cuMemPoolDestroy", cb_cuMemPoolDestroy(mp));
	return 0;
}

// ---- virtual memory management ----

static CBmemAllocationProp cb_vmm_prop;
static CBmemAccessDesc cb_vmm_access;
static size_t cb_vmm_gran;

static CUresult cb_vmm_setup(void) {
	memset(&cb_vmm_prop, 0, sizeof cb_vmm_prop);
	cb_vmm_prop.type = CB_MEM_ALLOCATION_TYPE_PINNED;
	cb_vmm_prop.requestedHandleTypes = CB_MEM_HANDLE_TYPE_POSIX_FD;
	cb_vmm_prop.location.type = CB_MEM_LOCATION_TYPE_DEVICE;
	cb_vmm_prop.location.id = cb_dev;
	cb_vmm_access.location = cb_vmm_prop.location;
	cb_vmm_access.flags = CB_MEM_ACCESS_PROT_READWRITE;
	CB_CK("cuMemGetAllocationGranularity",
		cb_cuMemGetAllocationGranularity(&cb_vmm_gran, &cb_vmm_prop, CB_MEM_ALLOC_GRANULARITY_RECOMMENDED));
	return 0;
}

static size_t cb_get_vmm_gran(void) { return cb_vmm_gran; }

// cb_vmm_allocfree: the calls of virtual.Resource Allocate + Close:
// reserve (aligned to the granularity), create, map, set access; wait for
// the stream, unmap, release, free the range.
static CUresult cb_vmm_allocfree(size_t size, long long n, double *ns) {
	double t0 = cb_now();
	for (long long i = 0; i < n; i++) {
		CUdeviceptr p;
		CUmemGenericAllocationHandle h;
		CB_CK("cuMemAddressReserve", cb_cuMemAddressReserve(&p, size, cb_vmm_gran, 0, 0));
		CB_CK("cuMemCreate", cb_cuMemCreate(&h, size, &cb_vmm_prop, 0));
		CB_CK("cuMemMap", cb_cuMemMap(p, size, 0, h, 0));
		CB_CK("cuMemSetAccess", cb_cuMemSetAccess(p, size, &cb_vmm_access, 1));
		CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_stream));
		CB_CK("cuMemUnmap", cb_cuMemUnmap(p, size));
		CB_CK("cuMemRelease", cb_cuMemRelease(h));
		CB_CK("cuMemAddressFree", cb_cuMemAddressFree(p, size));
	}
	*ns = cb_now() - t0;
	return 0;
}

// cb_vmm_growstep maps step-sized chunks one after another into one
// reservation of total bytes (create, map, set access per step; the first
// chunk untimed, as cudamem's Allocate before its Grows), and sums the
// time of the first and the last window steps.
static CUresult cb_vmm_growstep(size_t total, size_t step, int window, double *first, double *last) {
	long long chunks = (long long)(total / step), steps = chunks - 1;
	CUmemGenericAllocationHandle *hs = calloc((size_t)chunks, sizeof *hs);
	if (hs == NULL) {
		cb_failed = "calloc";
		return 2; // CUDA_ERROR_OUT_OF_MEMORY
	}
	CUdeviceptr base;
	CUresult r = cb_cuMemAddressReserve(&base, total, cb_vmm_gran, 0, 0);
	if (r != 0) {
		free(hs);
		cb_failed = "cuMemAddressReserve";
		return r;
	}
	long long made = 0, mapped = 0;
	*first = *last = 0;
	for (long long i = 0; i <= steps; i++) {
		CUdeviceptr at = base + (CUdeviceptr)i * step;
		double t0 = cb_now();
		if ((r = cb_cuMemCreate(&hs[i], step, &cb_vmm_prop, 0)) != 0) {
			cb_failed = "cuMemCreate";
			break;
		}
		made++;
		if ((r = cb_cuMemMap(at, step, 0, hs[i], 0)) != 0) {
			cb_failed = "cuMemMap";
			break;
		}
		mapped++;
		if ((r = cb_cuMemSetAccess(at, step, &cb_vmm_access, 1)) != 0) {
			cb_failed = "cuMemSetAccess";
			break;
		}
		double dt = cb_now() - t0;
		if (i >= 1 && i <= window) *first += dt;
		if (i > steps - window) *last += dt;
	}
	// Unmap what was mapped, then release and free; the first failure is
	// what is reported.
	for (long long i = 0; i < mapped; i++) {
		CUresult u = cb_cuMemUnmap(base + (CUdeviceptr)i * step, step);
		if (u != 0 && r == 0) { r = u; cb_failed = "cuMemUnmap"; }
	}
	for (long long i = 0; i < made; i++) {
		CUresult u = cb_cuMemRelease(hs[i]);
		if (u != 0 && r == 0) { r = u; cb_failed = "cuMemRelease"; }
	}
	CUresult u = cb_cuMemAddressFree(base, total);
	if (u != 0 && r == 0) { r = u; cb_failed = "cuMemAddressFree"; }
	free(hs);
	return r;
}

// ---- the driver pool pair from many threads ----

enum { CB_MT_MAX = 64 };
static CUstream cb_mt_streams[CB_MT_MAX];
static int cb_mt_nstreams, cb_mt_shared;
static long long cb_mt_per;
static size_t cb_mt_size;
static pthread_barrier_t cb_mt_barrier;
static pthread_mutex_t cb_mt_mu = PTHREAD_MUTEX_INITIALIZER;
static CUresult cb_mt_err;
static const char *cb_mt_failed;

static void cb_mt_fail(const char *call, CUresult r) {
	pthread_mutex_lock(&cb_mt_mu);
	if (cb_mt_err == 0) {
		cb_mt_err = r;
		cb_mt_failed = call;
	}
	pthread_mutex_unlock(&cb_mt_mu);
}

static void *cb_mt_work(void *arg) {
	long i = (long)arg;
	CUresult r = cb_cuCtxSetCurrent(cb_ctx);
	CUstream s = cb_mt_streams[cb_mt_shared ? 0 : i];
	pthread_barrier_wait(&cb_mt_barrier);
	if (r != 0) {
		cb_mt_fail("cuCtxSetCurrent", r);
		return NULL;
	}
	for (long long k = 0; k < cb_mt_per; k++) {
		CUdeviceptr p;
		if ((r = cb_cuMemAllocFromPoolAsync(&p, cb_mt_size, cb_pool, s)) != 0) {
			cb_mt_fail("cuMemAllocFromPoolAsync", r);
			return NULL;
		}
		if ((r = cb_cuMemFreeAsync(p, s)) != 0) {
			cb_mt_fail("cuMemFreeAsync", r);
			return NULL;
		}
	}
	return NULL;
}

static CUresult cb_mt_setup(void) {
	for (; cb_mt_nstreams < CB_MT_MAX; cb_mt_nstreams++) {
		CB_CK("cuStreamCreate", cb_cuStreamCreate(&cb_mt_streams[cb_mt_nstreams], CB_STREAM_NON_BLOCKING));
	}
	return 0;
}

static CUresult cb_mt_teardown(void) {
	for (; cb_mt_nstreams > 0; cb_mt_nstreams--) {
		CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_mt_streams[cb_mt_nstreams - 1]));
		CB_CK("cuStreamDestroy_v2", cb_cuStreamDestroy(cb_mt_streams[cb_mt_nstreams - 1]));
	}
	return 0;
}

// cb_mt_run starts t threads that wait at a barrier; the time runs from
// the barrier's release until the last thread is joined.
static CUresult cb_mt_run(int t, int shared, size_t size, long long per, double *ns) {
	if (t < 1 || t > CB_MT_MAX) {
		cb_failed = "cb_mt_run: thread count";
		return 1; // CUDA_ERROR_INVALID_VALUE
	}
	pthread_t th[CB_MT_MAX];
	cb_mt_shared = shared;
	cb_mt_size = size;
	cb_mt_per = per;
	cb_mt_err = 0;
	if (pthread_barrier_init(&cb_mt_barrier, NULL, (unsigned)t + 1) != 0) {
		cb_failed = "pthread_barrier_init";
		return 999;
	}
	int started = 0;
	for (long i = 0; i < t; i++) {
		if (pthread_create(&th[i], NULL, cb_mt_work, (void *)i) != 0) {
			break;
		}
		started++;
	}
	if (started < t) {
		// The barrier would never open: this is fatal for the program.
		cb_failed = "pthread_create";
		return 999;
	}
	pthread_barrier_wait(&cb_mt_barrier);
	double t0 = cb_now();
	for (int i = 0; i < t; i++) {
		pthread_join(th[i], NULL);
	}
	*ns = cb_now() - t0;
	pthread_barrier_destroy(&cb_mt_barrier);
	if (cb_mt_err != 0) {
		cb_failed = cb_mt_failed;
		return cb_mt_err;
	}
	return 0;
}

// ---- a pinned host pool (cuMemPoolCreate with a host location) ----

// cb_host_pools[0] is a host pool as created; [1] one whose memory the
// device may read and write (cuMemPoolSetAccess), as resource.PinnedPool
// grants.
static CUmemoryPool cb_host_pools[2];

// cb_hostpool_setup makes host pool rw (0 or 1). It returns the driver's
// answer without failing the program (drivers before CUDA 13 have no
// host-location pools), and a pool it made destroyed again if a later
// step failed.
static CUresult cb_hostpool_setup(int rw) {
	CBmemPoolProps pp;
	memset(&pp, 0, sizeof pp);
	pp.allocType = CB_MEM_ALLOCATION_TYPE_PINNED;
	pp.location.type = CB_MEM_LOCATION_TYPE_HOST;
	pp.location.id = 0;
	CUmemoryPool *p = &cb_host_pools[rw ? 1 : 0];
	CB_CK("cuMemPoolCreate", cb_cuMemPoolCreate(p, &pp));
	uint64_t thr = UINT64_MAX;
	CUresult r = cb_cuMemPoolSetAttribute(*p, CB_MEMPOOL_ATTR_RELEASE_THRESHOLD, &thr);
	if (r != 0) {
		cb_failed = "cuMemPoolSetAttribute(CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)";
		cb_cuMemPoolDestroy(*p);
		return r;
	}
	if (rw) {
		CBmemAccessDesc acc;
		memset(&acc, 0, sizeof acc);
		acc.location.type = CB_MEM_LOCATION_TYPE_DEVICE;
		acc.location.id = cb_dev;
		acc.flags = CB_MEM_ACCESS_PROT_READWRITE;
		if ((r = cb_cuMemPoolSetAccess(*p, &acc, 1)) != 0) {
			cb_failed = "cuMemPoolSetAccess";
			cb_cuMemPoolDestroy(*p);
			return r;
		}
	}
	return 0;
}

static CUresult cb_hostpool_pair(int rw, size_t size, long long warm, long long n, double *ns) {
	return cb_poolpair_on(cb_host_pools[rw ? 1 : 0], size, warm, n, ns);
}

static CUresult cb_hostpool_teardown(int rw) {
	CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_stream));
	CB_CK("cuMemPoolDestroy", cb_cuMemPoolDestroy(cb_host_pools[rw ? 1 : 0]));
	return 0;
}

// ---- batched copies: 10,000 copies of 4 KiB (cudamem's BenchmarkCopyBatch) ----

// CUmemcpyAttributes: the access order, two CUmemLocation hints, flags.
typedef struct {
	int srcAccessOrder;
	CBmemLocation srcLocHint;
	CBmemLocation dstLocHint;
	unsigned int flags;
} CBmemcpyAttributes;

enum {
	CB_BATCH_N = 10000,
	CB_BATCH_BLOCK = 4096,
	CB_MEMCPY_SRC_ACCESS_ORDER_STREAM = 1, // CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
};

static CUresult (*cb_cuMemcpyAsync)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
// cuMemcpyBatchAsync_v2 (CUDA 13.0) and the CUDA 12.8 ABI, with failIdx.
static CUresult (*cb_cuMemcpyBatchAsync_v2)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t,
	CBmemcpyAttributes *, size_t *, size_t, CUstream);
static CUresult (*cb_cuMemcpyBatchAsync_v1)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t,
	CBmemcpyAttributes *, size_t *, size_t, size_t *, CUstream);
static const char *cb_batch_missing; // why there is no batched call, or NULL

static CUdeviceptr cb_b_dst, cb_b_dsrc;
static void *cb_b_hsrc;
static CUdeviceptr cb_b_dsts[CB_BATCH_N], cb_b_srcs[2][CB_BATCH_N];
static size_t cb_b_sizes[CB_BATCH_N];
static CBmemcpyAttributes cb_b_attrs[2];
static size_t cb_b_attr_idx[1];

// cb_batch_setup resolves the entry points (the batched one is optional),
// allocates a pinned and a device source and a device destination, and
// lays out the copies as BenchmarkCopyBatch does: block i of the source to
// block i*7919 mod 10,000 of the destination.
static CUresult cb_batch_setup(void) {
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		cb_failed = "dlopen libcuda.so.1";
		return 999;
	}
	cb_cuMemcpyAsync = dlsym(h, "cuMemcpyAsync");
	if (cb_cuMemcpyAsync == NULL) {
		cb_failed = "dlsym cuMemcpyAsync";
		return 999;
	}
	cb_cuMemcpyBatchAsync_v2 = dlsym(h, "cuMemcpyBatchAsync_v2");
	if (cb_cuMemcpyBatchAsync_v2 == NULL) {
		cb_cuMemcpyBatchAsync_v1 = dlsym(h, "cuMemcpyBatchAsync");
	}
	if (cb_cuMemcpyBatchAsync_v2 == NULL && cb_cuMemcpyBatchAsync_v1 == NULL) {
		cb_batch_missing = "the driver has no cuMemcpyBatchAsync (CUDA 12.8 and later)";
	}
	size_t bytes = (size_t)CB_BATCH_N * CB_BATCH_BLOCK;
	CB_CK("cuMemAlloc_v2", cb_cuMemAlloc(&cb_b_dst, bytes));
	CB_CK("cuMemAlloc_v2", cb_cuMemAlloc(&cb_b_dsrc, bytes));
	CB_CK("cuMemAllocHost_v2", cb_cuMemAllocHost(&cb_b_hsrc, bytes));
	memset(cb_b_hsrc, 3, bytes);
	CB_CK("cuMemsetD32Async", cb_cuMemsetD32Async(cb_b_dsrc, 5, bytes / 4, cb_stream));
	CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_stream));
	for (size_t i = 0; i < CB_BATCH_N; i++) {
		size_t j = i * 7919 % CB_BATCH_N;
		cb_b_dsts[i] = cb_b_dst + j * CB_BATCH_BLOCK;
		cb_b_srcs[0][i] = (CUdeviceptr)(uintptr_t)cb_b_hsrc + i * CB_BATCH_BLOCK;
		cb_b_srcs[1][i] = cb_b_dsrc + i * CB_BATCH_BLOCK;
		cb_b_sizes[i] = CB_BATCH_BLOCK;
	}
	// One attribute for the whole batch, as cudamem's CopyBatch gives
	// (stream order; the source is the host or the device, the
	// destination the device).
	for (int k = 0; k < 2; k++) {
		memset(&cb_b_attrs[k], 0, sizeof cb_b_attrs[k]);
		cb_b_attrs[k].srcAccessOrder = CB_MEMCPY_SRC_ACCESS_ORDER_STREAM;
		cb_b_attrs[k].srcLocHint.type = k == 0 ? CB_MEM_LOCATION_TYPE_HOST : CB_MEM_LOCATION_TYPE_DEVICE;
		cb_b_attrs[k].srcLocHint.id = k == 0 ? 0 : cb_dev;
		cb_b_attrs[k].dstLocHint.type = CB_MEM_LOCATION_TYPE_DEVICE;
		cb_b_attrs[k].dstLocHint.id = cb_dev;
	}
	cb_b_attr_idx[0] = 0;
	return 0;
}

static CUresult cb_batch_once(int dtod, int batched) {
	CUdeviceptr *srcs = cb_b_srcs[dtod ? 1 : 0];
	if (!batched) {
		for (size_t i = 0; i < CB_BATCH_N; i++) {
			CB_CK("cuMemcpyAsync", cb_cuMemcpyAsync(cb_b_dsts[i], srcs[i], cb_b_sizes[i], cb_stream));
		}
		return 0;
	}
	CBmemcpyAttributes *a = &cb_b_attrs[dtod ? 1 : 0];
	if (cb_cuMemcpyBatchAsync_v2 != NULL) {
		CB_CK("cuMemcpyBatchAsync_v2", cb_cuMemcpyBatchAsync_v2(cb_b_dsts, srcs, cb_b_sizes, CB_BATCH_N, a, cb_b_attr_idx, 1, cb_stream));
	} else {
		size_t fail_idx;
		CB_CK("cuMemcpyBatchAsync", cb_cuMemcpyBatchAsync_v1(cb_b_dsts, srcs, cb_b_sizes, CB_BATCH_N, a, cb_b_attr_idx, 1, &fail_idx, cb_stream));
	}
	return 0;
}

// cb_batch_run times n batches of 10,000 copies (one untimed first), the
// stream synchronized once after the last inside the timed span.
static CUresult cb_batch_run(int dtod, int batched, long long n, double *ns) {
	CUresult r = cb_batch_once(dtod, batched);
	if (r != 0) {
		return r;
	}
	CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_stream));
	double t0 = cb_now();
	for (long long i = 0; i < n; i++) {
		if ((r = cb_batch_once(dtod, batched)) != 0) {
			return r;
		}
	}
	CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_stream));
	*ns = cb_now() - t0;
	return 0;
}

static CUresult cb_batch_teardown(void) {
	CB_CK("cuStreamSynchronize", cb_cuStreamSynchronize(cb_stream));
	CB_CK("cuMemFree_v2", cb_cuMemFree(cb_b_dst));
	CB_CK("cuMemFree_v2", cb_cuMemFree(cb_b_dsrc));
	CB_CK("cuMemFreeHost", cb_cuMemFreeHost(cb_b_hsrc));
	return 0;
}

static const char *cb_get_batch_missing(void) { return cb_batch_missing; }

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
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unsafe"
)

// The primary context is made current on one OS thread; keep main's goroutine on it.
func init() { runtime.LockOSThread() }

const (
	copyBytes = 256 << 20
	poolWarm  = 1000

	ipcChildArg  = "-ipc-child" // the hidden first argument of the re-executed child
	ipcEnvDesc   = "CGOBENCH_IPC_EXPORT_DATA"
	ipcEnvDevice = "CGOBENCH_IPC_DEVICE"
	ipcEnvAgain  = "CGOBENCH_IPC_AGAIN" // "1": the child times its second import
	ipcFill      = 42

	vmmStep   = 2 << 20
	vmmWindow = 16
	vmmMargin = 1 << 30 // free device memory left untouched when deciding to skip
)

type result struct {
	Name    string  `json:"name"`
	NsPerOp float64 `json:"ns_per_op"`
	GBps    float64 `json:"gbps,omitempty"`
	Iters   int64   `json:"iters"`
	Rep     int     `json:"rep,omitempty"`
	Error   string  `json:"error,omitempty"` // -serve: why there is no figure
}

type measurement struct {
	name    string
	iters   int64 // default count, scaled by -iters
	bytes   int64 // bytes moved per iteration; 0 for calls that move none
	perIter int64 // operations per iteration (threads, grow steps); 0 means 1
	context bool  // needs the context, stream and pool
	buffers bool  // needs the copy buffers
	needs   string
	warm    bool // run n/10 iterations untimed first
	// skip, if set, says why the measurement cannot run now ("" to run).
	skip func() string
	// run returns the time of n iterations, and of the side figure.
	run  func(n int64) (ns, sideNs float64)
	side string // the name of the side figure, if any
}

// Setups beyond the context, made once for the measurements that need them.
const (
	needIPC        = "ipc"
	needVMM        = "vmm"
	needMT         = "mt"
	needHostPool   = "hostpool"
	needHostPoolRW = "hostpool_rw"
	needBatch      = "batch"
)

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

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "cgo-baseline: "+format+"\n", args...)
	os.Exit(1)
}

// flags are the command line, read by main.
var flags struct {
	device int
	scale  float64
	growTo uint64
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == ipcChildArg {
		ipcChildMain()
		return
	}
	device := flag.Int("device", 0, "CUDA device ordinal")
	only := flag.String("only", "", "run only measurements whose name starts with `PREFIX`")
	names := flag.String("names", "", "run only the measurements in this comma-separated `LIST` of exact names")
	scale := flag.Float64("iters", 1, "multiply every measurement's default iteration count by `X`")
	count := flag.Int("count", 1, "run each measurement `N` times (one JSON line each)")
	growTo := flag.Uint64("grow-to", 8<<30, "`BYTES` vmm/growstep/c grows to, in 2 MiB steps")
	serve := flag.Bool("serve", false, "set up, then run one repetition of the measurement named on each line of stdin (see serveRequests)")
	flag.Parse()
	if flag.NArg() != 0 || *scale <= 0 || math.IsInf(*scale, 0) || math.IsNaN(*scale) || *count < 1 ||
		*growTo%vmmStep != 0 || *growTo < (2*vmmWindow+1)*vmmStep {
		flag.Usage()
		os.Exit(2)
	}
	flags.device, flags.scale, flags.growTo = *device, *scale, *growTo

	want := map[string]bool{}
	for _, n := range strings.Split(*names, ",") {
		if n != "" {
			want[n] = true
		}
	}
	var ms []measurement
	for _, m := range measurements() {
		if strings.HasPrefix(m.name, *only) && (len(want) == 0 || want[m.name] || want[m.side]) {
			ms = append(ms, m)
		}
	}
	if len(ms) == 0 {
		fmt.Fprintf(os.Stderr, "cgo-baseline: no measurement matches -only %q -names %q\n", *only, *names)
		os.Exit(2)
	}

	if msg := C.cb_load(); msg != nil {
		fmt.Fprintf(os.Stderr, "cgo-baseline: %s\n", C.GoString(msg))
		os.Exit(1)
	}

	needContext, needBuffers := false, false
	needs := map[string]bool{}
	for _, m := range ms {
		needContext = needContext || m.context
		needBuffers = needBuffers || m.buffers
		if m.needs != "" {
			needs[m.needs] = true
		}
	}
	if needContext {
		checkC(C.cb_setup(C.int(*device)))
	}
	if needBuffers {
		checkC(C.cb_copy_setup(copyBytes))
	}
	var teardown []func()
	if needs[needIPC] {
		teardown = append(teardown, ipcSetup())
	}
	if needs[needVMM] {
		checkC(C.cb_vmm_setup())
	}
	if needs[needMT] {
		checkC(C.cb_mt_setup())
		teardown = append(teardown, func() { checkC(C.cb_mt_teardown()) })
	}
	if needs[needBatch] {
		checkC(C.cb_batch_setup())
		teardown = append(teardown, func() { checkC(C.cb_batch_teardown()) })
	}
	for rw, need := range []string{needHostPool, needHostPoolRW} {
		if !needs[need] {
			continue
		}
		if r := C.cb_hostpool_setup(C.int(rw)); r != 0 {
			hostPoolErr[rw] = fmt.Sprintf("%s: %s", C.GoString(C.cb_failed_call()), C.GoString(C.cb_error_name(r)))
		} else {
			teardown = append(teardown, func() { checkC(C.cb_hostpool_teardown(C.int(rw))) })
		}
	}

	enc := json.NewEncoder(os.Stdout)
	if *serve {
		serveRequests(ms, enc)
		ms = nil // served; the teardown below still runs
	}
	for i, m := range ms {
		n := int64(math.Round(float64(m.iters) * *scale))
		if n < 1 {
			n = 1
		}
		fmt.Fprintf(os.Stderr, "cgo-baseline: [%d/%d] %s (%d × %d iterations)\n", i+1, len(ms), m.name, *count, n)
		if m.skip != nil {
			if why := m.skip(); why != "" {
				fmt.Fprintf(os.Stderr, "cgo-baseline: skipped %s: %s\n", m.name, why)
				continue
			}
		}
		if m.warm {
			m.run(max(1, n/10))
		}
		for rep := 1; rep <= *count; rep++ {
			for _, r := range repeat(m, n, rep) {
				if err := enc.Encode(r); err != nil {
					fatalf("%v", err)
				}
			}
		}
	}

	for i := len(teardown) - 1; i >= 0; i-- {
		teardown[i]()
	}
	if needBuffers {
		checkC(C.cb_copy_teardown())
	}
	if needContext {
		checkC(C.cb_teardown())
	}
}

// repeat runs m once (a repetition numbered rep) and returns its lines.
func repeat(m measurement, n int64, rep int) []result {
	ops := n * max(1, m.perIter)
	ns, sideNs := m.run(n)
	out := []result{{Name: m.name, NsPerOp: ns / float64(ops), Iters: ops, Rep: rep}}
	if m.bytes > 0 && ns > 0 {
		out[0].GBps = float64(m.bytes) * float64(n) / ns
	}
	if m.side != "" {
		out = append(out, result{Name: m.side, NsPerOp: sideNs / float64(ops), Iters: ops, Rep: rep})
	}
	return out
}

// serveRequests is -serve: cudamem bench alternates its measurements
// with these, one repetition each in turn, so that the driver's state
// drifts alike under both. Each line of stdin names a measurement; the
// answer is its JSON lines (the measurement's, then its side figure's),
// then an empty line. A measurement's first request runs its warm-up
// first; its repetitions are numbered from 1. A name not set up (not in
// -names), or a skip, is answered with one line with "error" set. An
// empty line first says the setup is done. The serving ends at the end of
// stdin.
func serveRequests(ms []measurement, enc *json.Encoder) {
	by := map[string]measurement{}
	for _, m := range ms {
		by[m.name] = m
	}
	if _, err := os.Stdout.WriteString("\n"); err != nil {
		fatalf("%v", err)
	}
	reps := map[string]int{}
	said := map[string]bool{} // skips reported on stderr
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		name := strings.TrimSpace(in.Text())
		m, ok := by[name]
		var out []result
		switch {
		case !ok:
			out = []result{{Name: name, Error: "not set up (not in -names)"}}
		case m.skip != nil && m.skip() != "":
			why := m.skip()
			if !said[name] {
				fmt.Fprintf(os.Stderr, "cgo-baseline: skipped %s: %s\n", name, why)
				said[name] = true
			}
			out = []result{{Name: name, Error: "skipped: " + why}}
		default:
			n := int64(math.Round(float64(m.iters) * flags.scale))
			n = max(n, 1)
			if reps[name] == 0 && m.warm {
				m.run(max(1, n/10))
			}
			reps[name]++
			out = repeat(m, n, reps[name])
		}
		for _, r := range out {
			if err := enc.Encode(r); err != nil {
				fatalf("%v", err)
			}
		}
		if _, err := os.Stdout.WriteString("\n"); err != nil {
			fatalf("%v", err)
		}
	}
	if err := in.Err(); err != nil {
		fatalf("reading requests: %v", err)
	}
}

func sizeLabel(n uint64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

// batchCopies copies of batchBlock bytes make one batch/* iteration, as in
// cudamem's BenchmarkCopyBatch.
const (
	batchCopies = 10_000
	batchBlock  = 4 << 10
)

// mtCounts are the thread counts and the pairs each thread makes per run,
// as in cudamem bench's suballoc/mt table.
var mtCounts = []struct{ t, iters int64 }{{1, 20_000}, {4, 20_000}, {16, 8_000}, {64, 2_000}}

func measurements() []measurement {
	ms := []measurement{
		{name: "trivial/c", iters: 1_000_000, run: noSide(trivialC)},
		{name: "trivial/cgo", iters: 1_000_000, run: noSide(trivialCgo)},
	}
	for _, sz := range []struct {
		label string
		bytes int64
	}{{"256B", 256}, {"1MiB", 1 << 20}, {"64MiB", 64 << 20}} {
		size := C.size_t(sz.bytes)
		ms = append(ms,
			measurement{name: "poolpair/c/" + sz.label, iters: 200_000, context: true,
				run: noSide(func(n int64) float64 { return poolpairC(size, n) })},
			measurement{name: "poolpair/cgo/" + sz.label, iters: 200_000, context: true,
				run: noSide(func(n int64) float64 { return poolpairCgo(size, n) })},
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
			run: noSide(func(n int64) float64 { return copyC(kind, n) })})
	}
	ms = append(ms,
		measurement{name: "ipc/pool_create_export/c", iters: 200, context: true, warm: true,
			run: noSide(func(n int64) float64 {
				var ns C.double
				checkC(C.cb_ipc_pool_create_export(C.longlong(n), &ns))
				return float64(ns)
			})},
		measurement{name: "ipc/child_import/c", side: "ipc/child_init/c", iters: 10, context: true, needs: needIPC, warm: true,
			run: func(n int64) (float64, float64) { return ipcChildren(n, false) }},
		measurement{name: "ipc/child_import/again/c", iters: 10, context: true, needs: needIPC, warm: true,
			run: noSide(func(n int64) float64 { ns, _ := ipcChildren(n, true); return ns })},
		measurement{name: "poolpair/hostpool/c/1MiB", iters: 200_000, context: true, needs: needHostPool,
			skip: func() string { return hostPoolErr[0] },
			run: noSide(func(n int64) float64 {
				var ns C.double
				checkC(C.cb_hostpool_pair(0, 1<<20, poolWarm, C.longlong(n), &ns))
				return float64(ns)
			})},
		measurement{name: "poolpair/hostpool_rw/c/1MiB", iters: 200_000, context: true, needs: needHostPoolRW,
			skip: func() string { return hostPoolErr[1] },
			run: noSide(func(n int64) float64 {
				var ns C.double
				checkC(C.cb_hostpool_pair(1, 1<<20, poolWarm, C.longlong(n), &ns))
				return float64(ns)
			})},
	)
	for _, sz := range []struct {
		size  uint64
		iters int64
	}{{2 << 20, 500}, {64 << 20, 100}, {1 << 30, 20}, {16 << 30, 4}} {
		size := sz.size
		ms = append(ms, measurement{name: "vmm/allocfree/c/" + sizeLabel(size), iters: sz.iters, context: true, needs: needVMM, warm: true,
			skip: func() string { return memShort(size) },
			run: noSide(func(n int64) float64 {
				var ns C.double
				checkC(C.cb_vmm_allocfree(C.size_t(size), C.longlong(n), &ns))
				return float64(ns)
			})})
	}
	grow := "vmm/growstep/c/to" + sizeLabel(flags.growTo)
	ms = append(ms, measurement{name: grow + "/first16", side: grow + "/last16", iters: 1, perIter: vmmWindow,
		context: true, needs: needVMM, warm: true,
		skip: func() string { return memShort(flags.growTo) },
		run: func(n int64) (float64, float64) {
			step := max(vmmStep, uint64(C.cb_get_vmm_gran()))
			var first, last float64
			for i := int64(0); i < n; i++ {
				var f, l C.double
				checkC(C.cb_vmm_growstep(C.size_t(flags.growTo), C.size_t(step), vmmWindow, &f, &l))
				first += float64(f)
				last += float64(l)
			}
			return first, last
		}})
	for _, dir := range []string{"htod", "dtod"} {
		for _, mode := range []string{"c_batched", "c_loop"} {
			dtod, batched := C.int(0), C.int(0)
			if dir == "dtod" {
				dtod = 1
			}
			var skip func() string
			if mode == "c_batched" {
				batched = 1
				skip = func() string {
					if m := C.cb_get_batch_missing(); m != nil {
						return C.GoString(m)
					}
					return ""
				}
			}
			ms = append(ms, measurement{name: "batch/" + dir + "/" + mode, iters: 20, perIter: batchCopies,
				bytes: batchCopies * batchBlock, context: true, needs: needBatch, skip: skip,
				run: noSide(func(n int64) float64 {
					var ns C.double
					checkC(C.cb_batch_run(dtod, batched, C.longlong(n), &ns))
					return float64(ns)
				})})
		}
	}
	for _, mode := range []string{"own", "shared"} {
		shared := C.int(0)
		if mode == "shared" {
			shared = 1
		}
		for _, c := range mtCounts {
			t := c.t
			ms = append(ms, measurement{name: fmt.Sprintf("poolpair/mt/c/%d/%s", t, mode), iters: c.iters, perIter: t,
				context: true, needs: needMT, warm: true,
				run: noSide(func(n int64) float64 {
					var ns C.double
					checkC(C.cb_mt_run(C.int(t), shared, 256, C.longlong(n), &ns))
					return float64(ns)
				})})
		}
	}
	return ms
}

func noSide(f func(n int64) float64) func(n int64) (float64, float64) {
	return func(n int64) (float64, float64) { return f(n), 0 }
}

// hostPoolErr says why there is no host pool ("" when there is one): [0]
// the plain one, [1] the one the device may access.
var hostPoolErr [2]string

// memShort says why size bytes of device memory cannot be had now, or "".
func memShort(size uint64) string {
	var free C.size_t
	checkC(C.cb_mem_free(&free))
	if size+vmmMargin > uint64(free) {
		return fmt.Sprintf("needs %s of device memory plus %s spare, and %.1f GiB is free", sizeLabel(size), sizeLabel(vmmMargin), float64(free)/(1<<30))
	}
	return ""
}

// ipc/child_import/c state: the exported pool's fd and the export data of
// its one buffer.
var ipcParent struct {
	file *os.File
	data string // hex
	exe  string
}

// ipcSetup makes the pool and buffer the children import, and returns
// their teardown.
func ipcSetup() func() {
	var fd C.int
	data := make([]byte, 64)
	checkC(C.cb_ipc_parent_setup(ipcFill, &fd, (*C.uchar)(unsafe.Pointer(&data[0]))))
	exe, err := os.Executable()
	if err != nil {
		fatalf("%v", err)
	}
	ipcParent.file = os.NewFile(uintptr(fd), "cgobench-ipc-pool")
	ipcParent.data = hex.EncodeToString(data)
	ipcParent.exe = exe
	return func() {
		if err := ipcParent.file.Close(); err != nil {
			fatalf("closing the pool fd: %v", err)
		}
		checkC(C.cb_ipc_parent_teardown())
	}
}

// ipcChildReport is the child's one line on stdout (the shape cudamem
// bench's child prints).
type ipcChildReport struct {
	InitNs   int64 `json:"init_ns"`
	ImportNs int64 `json:"import_ns"`
	First    []int `json:"first"`
}

// ipcChildren runs n children one after another, and returns the sum of
// their import times and of their init times. With again, each child
// imports and lets go once untimed, and times its second import: what an
// import costs once the process has run one.
func ipcChildren(n int64, again bool) (importNs, initNs float64) {
	for i := int64(0); i < n; i++ {
		cmd := exec.Command(ipcParent.exe, ipcChildArg)
		cmd.Env = append(os.Environ(), ipcEnvDesc+"="+ipcParent.data, ipcEnvDevice+"="+strconv.Itoa(flags.device))
		if again {
			cmd.Env = append(cmd.Env, ipcEnvAgain+"=1")
		}
		cmd.ExtraFiles = []*os.File{ipcParent.file}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			fatalf("ipc child: %v: %s", err, strings.TrimSpace(stderr.String()))
		}
		var rep ipcChildReport
		if err := json.Unmarshal(bytes.TrimSpace(out), &rep); err != nil {
			fatalf("ipc child printed %q: %v", out, err)
		}
		for j, v := range rep.First {
			if v != ipcFill {
				fatalf("ipc child read byte %d as %d, want %d", j, v, ipcFill)
			}
		}
		if len(rep.First) == 0 {
			fatalf("ipc child read nothing back")
		}
		importNs += float64(rep.ImportNs)
		initNs += float64(rep.InitNs)
	}
	return importNs, initNs
}

// ipcChildMain is the child: load the driver, cuInit and the primary
// context (init), then import the pool from fd 3 and the pointer (import,
// timed in C), read 4 bytes back, and print an ipcChildReport.
func ipcChildMain() {
	t0 := time.Now()
	ord, err := strconv.Atoi(os.Getenv(ipcEnvDevice))
	if err != nil {
		fatalf("%s: %v", ipcEnvDevice, err)
	}
	data, err := hex.DecodeString(os.Getenv(ipcEnvDesc))
	if err != nil || len(data) != 64 {
		fatalf("%s: want 64 bytes of hex (%v)", ipcEnvDesc, err)
	}
	if msg := C.cb_load(); msg != nil {
		fatalf("%s", C.GoString(msg))
	}
	checkC(C.cb_child_init(C.int(ord)))
	initNs := time.Since(t0).Nanoseconds()
	var ns C.double
	first := make([]byte, 4)
	cdata := C.CBytes(data)
	defer C.free(cdata)
	if os.Getenv(ipcEnvAgain) == "1" {
		checkC(C.cb_ipc_child(3, (*C.uchar)(cdata), &ns, (*C.uchar)(unsafe.Pointer(&first[0]))))
	}
	checkC(C.cb_ipc_child(3, (*C.uchar)(cdata), &ns, (*C.uchar)(unsafe.Pointer(&first[0]))))
	rep := ipcChildReport{InitNs: initNs, ImportNs: int64(ns)}
	for _, b := range first {
		rep.First = append(rep.First, int(b))
	}
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		fatalf("%v", err)
	}
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
