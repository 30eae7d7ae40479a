// fakecuda: a fake CUDA driver for CPU tests of cudamem (fault sweeps).
//
// It emulates, with host memory, the driver entry points cudamem's memory
// stack uses: devices, primary contexts, streams and events (synchronous),
// synchronous, pinned and managed allocations, copies and fills, memory
// pools (with IPC export/import inside one process) and virtual memory
// management (reserve = PROT_NONE mapping, physical memory = memfd, map =
// MAP_FIXED|MAP_SHARED). "Device" memory is ordinary host memory, so copies
// are memcpy and tests can compare bytes.
//
// It is strict where a real driver is strict and a library bug could hide:
// every handle is looked up in a table before use (a stale or made-up handle
// is an error, never a crash; where a real driver may crash instead, on a
// destroyed context for one, the call is also counted: see crash), calls that need a context fail with
// CUDA_ERROR_INVALID_CONTEXT when none is current on the calling thread, and
// a copy or fill touching device memory that is not allocated (or a VMM
// range that is not mapped with access) fails instead of touching it.
//
// It counts exactly what is in use: fakecuda_stat(i) returns device bytes,
// pinned bytes, managed bytes and live object counts, so tests can assert
// that every operation returns to its baseline.
//
// Contexts: primary contexts, contexts made with cuCtxCreate (_v2 and _v4,
// pushed on a per-thread stack that cuCtxPopCurrent pops) and green
// contexts. cuCtxDestroy destroys the context's streams and events, as
// CUDA does; cuGreenCtxDestroy leaves its streams dead and counted (CUDA
// leaks them). cuStreamGetCtx(_v2) reports a stream's context. Memory is
// not tied to contexts. fakecuda_set_ctx_reuse makes new contexts take the
// addresses of destroyed ones, as a real driver may.
//
// Modules and kernels: PTX loads, and cudamem's own test kernels
// (internal/testkit/kernels) run on the host; other kernels are not emulated.
// Graph launches run the copies, fills and kernels captured into them.
//
// Managed memory: cuMemAllocManaged and managed pools (CUDA 13.0, and a
// default one) keep,
// per page, the advice given and the last prefetch location, which
// cuMemRangeGetAttribute reads back; the batched prefetch and discard
// calls check the whole batch before applying any of it, and a discard
// scribbles over the range (its contents are indeterminate).
// FAKECUDA_NO_CONCURRENT_MANAGED=1 plays devices without concurrent
// managed access.
//
// Not emulated: other kernels, asynchrony (every call completes before
// it returns), cross-process sharing other than pool IPC (legacy IPC and
// VMM handle exports work inside one process only), CUDA 13 host
// default pools (cuMemGetDefaultMemPool is absent, so it reports "not
// supported"; cuMemGetMemPool knows devices' pools and the default managed
// pool only).
//
// Environment: FAKECUDA_DEVICES (1 or 2, default 1), FAKECUDA_VERSION
// (default 13000), FAKECUDA_TOTAL_MEM (bytes per device, default 4 GiB),
// FAKECUDA_FABRIC (fabric handles: "1" working, "none" unsupported, else
// supported by the device but without IMEX; see fabric_mode),
// FAKECUDA_NO_CONCURRENT_MANAGED ("1": no concurrent managed access).
//
// Written from the CUDA driver API documentation's enum values and struct
// layouts; built by the tests with the system C compiler; never shipped.
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <fcntl.h>

typedef int CUresult;
typedef unsigned long long u64;

enum {
	OK = 0,
	E_INVALID_VALUE = 1,
	E_OUT_OF_MEMORY = 2,
	E_NOT_INITIALIZED = 3,
	E_INVALID_DEVICE = 101,
	E_INVALID_CONTEXT = 201,
	E_INVALID_HANDLE = 400,
	E_NOT_READY = 600,
	E_ILLEGAL_ADDRESS = 700,
	E_PEER_ALREADY = 704,
	E_PEER_NOT_ENABLED = 705,
	E_NOT_PERMITTED = 800,
	E_NOT_SUPPORTED = 801,
	E_ILLEGAL_STATE = 401,
	E_CAPTURE_UNSUPPORTED = 900,
	E_CAPTURE_INVALIDATED = 901,
	E_CAPTURE_UNMATCHED = 903,
	E_CAPTURE_UNJOINED = 904,
	E_CAPTURE_ISOLATION = 905,
	E_CAPTURE_IMPLICIT = 906,
	E_CAPTURED_EVENT = 907,
	E_UNKNOWN = 999,
};

#define MAXDEV 2
#define GRAN (2ull << 20) /* VMM granularity, as on current GPUs */
#define PAGE 4096ull

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
#define LOCK() pthread_mutex_lock(&mu)
#define UNLOCK() pthread_mutex_unlock(&mu)

/* Fabric handles: defined under the "Fabric handles" marker below. */
static int fabric_mode(void);
static CUresult fabric_gate(void);
static CUresult fabric_mem_export(void *out, u64 hv, u64 flags);
static CUresult fabric_mem_import(u64 *out, const void *fh);
static CUresult fabric_pool_export(void *out, void *h, u64 flags);
static CUresult fabric_pool_import(void **out, const void *fh, u64 flags);

static int no_concurrent_managed(void); /* see the managed memory calls */

static int driver_version = 13000;
static int ndev = 1;
static u64 total_mem = 4ull << 30;
static int initialized;

/* ---- statistics (see fakecuda_stat) ---- */
enum {
	ST_DEVICE_BYTES,   /* device memory in use: cuMemAlloc, device pools (used), cuMemCreate on a device */
	ST_PINNED_BYTES,   /* cuMemAllocHost / cuMemHostAlloc / host pools (used) / cuMemCreate on the host */
	ST_MANAGED_BYTES,  /* cuMemAllocManaged */
	ST_ALLOCS,         /* live allocations of every kind (incl. pool and imported pointers) */
	ST_STREAMS,        /* live created streams */
	ST_EVENTS,         /* live events */
	ST_POOLS,          /* live created or imported pools (default pools excluded) */
	ST_VMM_HANDLES,    /* live physical allocation handles (created or imported) */
	ST_RESERVATIONS,   /* live reserved address ranges */
	ST_MAPPINGS,       /* live mappings */
	ST_REGISTERED,     /* live host registrations */
	ST_CTX_RETAINS,    /* primary context retain count, all devices */
	ST_CALLS,          /* entry-point calls made */
	ST_DEVICE_BYTES_1, /* device memory in use on device 1 */
	ST_GRAPHS,         /* live graphs (captured, or being captured) */
	ST_GRAPH_EXECS,    /* live executable graphs */
	ST_GRAPH_USED,     /* graph memory allocated by launches, not yet freed (bytes, all devices) */
	ST_GRAPH_RESERVED, /* graph memory reserved (bytes, all devices; cuDeviceGraphMemTrim gives it back) */
	ST_CONTEXTS,       /* live contexts made with cuCtxCreate (primary ones excluded) */
	ST_CRASHES,        /* calls a real driver may crash the process on (see crash) */
	ST_N
};
static long long stats[ST_N];

/* crash records a call on which a real driver may crash the process
   instead of returning an error: a destroyed context or green context
   handed back to it (the handle points at freed memory), a stream that
   died with its context, or cuMemPoolDestroy of a fabric pool made
   without IMEX (see fMemPoolDestroy). The fake returns an error and
   counts it, so tests can assert that cudamem never gets there. Atomic:
   some callers do not hold the lock. */
static void crash(void) { __atomic_fetch_add(&stats[ST_CRASHES], 1, __ATOMIC_SEQ_CST); }

/* ---- contexts ---- */
typedef struct ctx {
	int magic;
	int dev;
	int retains;
	int peer[MAXDEV];
	int made; /* from cuCtxCreate (not a primary context) */
	int dead; /* destroyed: its handle is never valid again */
	void *green; /* the green context this one was converted from, if any */
} ctx_t;
#define CTX_MAGIC 0x43545821
static ctx_t ctxs[MAXDEV] = {{CTX_MAGIC, 0, 0, {0}}, {CTX_MAGIC, 1, 0, {0}}};
static __thread ctx_t *current;

/* Contexts made with cuCtxCreate: slots are not reused unless
   fakecuda_set_ctx_reuse asks for it, so a destroyed context's handle
   stays invalid (and a thread that still has it current points at memory
   that stays allocated). A real driver frees a destroyed context and may
   give its address to the next one: reuse mode models that, a new context
   taking the first dead slot. */
#define MAXC 1024
static ctx_t made_ctxs[MAXC];
static int nmade;
static int reuse_ctx;
static ctx_t *as_made(void *p) {
	for (int i = 0; i < nmade; i++)
		if (p == (void *)&made_ctxs[i] && !made_ctxs[i].dead) return &made_ctxs[i];
	return 0;
}
/* dead_made reports whether p is a destroyed context's handle. */
static int dead_made(void *p) {
	for (int i = 0; i < nmade; i++)
		if (p == (void *)&made_ctxs[i]) return made_ctxs[i].dead;
	return 0;
}
/* new_made returns a free context slot: a dead one in reuse mode, else
   the next unused one (0 when none is left). Called with the lock held. */
static ctx_t *new_made(void) {
	if (reuse_ctx)
		for (int i = 0; i < nmade; i++)
			if (made_ctxs[i].dead) return &made_ctxs[i];
	return nmade == MAXC ? 0 : &made_ctxs[nmade++];
}
int fakecuda_set_ctx_reuse(int on) {
	LOCK();
	int old = reuse_ctx;
	reuse_ctx = on != 0;
	UNLOCK();
	return old;
}
static ctx_t *as_ctx(void *p) {
	for (int i = 0; i < ndev; i++)
		if (p == (void *)&ctxs[i]) return &ctxs[i];
	return as_made(p);
}

/* ---- pools ---- */
typedef struct pool {
	int alloc_type, handle_types, loc_type, loc_id;
	u64 max_size, threshold;
	int reuse[3];
	u64 used, used_high, reserved, reserved_high;
	int is_default, imported;
	long long id;          /* identity for export; the origin's id for an import */
	int access[MAXDEV];    /* CUmemAccess_flags per device */
	int live;
	int doomed;            /* fabric handles made without IMEX: destroying it is a crash */
	int remote_pid;        /* an import of another process's pool: that process (0: this one) */
} pool_t;
#define MAXPOOLS 4096
static pool_t *pools[MAXPOOLS];
static int npools;
static long long next_pool_id = 1;
static pool_t default_pool[MAXDEV];
static pool_t *current_pool[MAXDEV];
static pool_t default_managed; /* the default managed pool, no preferred location (CUDA 13.0) */

static pool_t *as_pool(void *p) {
	if (p == (void *)&default_managed && default_managed.live) return &default_managed;
	for (int i = 0; i < ndev; i++)
		if (p == (void *)&default_pool[i]) return &default_pool[i];
	for (int i = 0; i < npools; i++)
		if (pools[i] == p && pools[i]->live) return pools[i];
	return 0;
}

static int pool_dev_bytes(pool_t *p) { return p->loc_type == 1 && p->alloc_type == 1; }

/* ---- allocations ---- */
enum { K_DEVICE, K_PINNED, K_MANAGED, K_POOL, K_IMPORT, K_REGISTERED, K_GRAPH };
/* mpage_t is what the driver keeps of one page of managed memory: its
   advice and where it was last prefetched (location types as
   CUmemLocationType, 0 for none), which cuMemRangeGetAttribute reads. */
typedef struct {
	int read_mostly;
	int pref_type, pref_id;
	int last_type, last_id;
	unsigned accessed; /* bit d: device d has SET_ACCESSED_BY; bit MAXDEV: the host */
} mpage_t;
typedef struct alloc {
	u64 base, size, maplen;
	int kind, dev;
	pool_t *pool;
	int memfd1; /* the memfd backing it, plus one (0: none; see new_alloc) */
	mpage_t *pages; /* managed memory: one entry per page (see mpage_t) */
} alloc_t;
static int is_managed(const alloc_t *a) {
	return a->kind == K_MANAGED || (a->kind == K_POOL && a->pool->alloc_type == 2);
}
static alloc_t *allocs;
static int nallocs, capallocs;

static void add_bytes(int kind, int dev, pool_t *p, long long n) {
	switch (kind) {
	case K_DEVICE:
		stats[ST_DEVICE_BYTES] += n;
		if (dev == 1) stats[ST_DEVICE_BYTES_1] += n;
		break;
	case K_PINNED: stats[ST_PINNED_BYTES] += n; break;
	case K_MANAGED: stats[ST_MANAGED_BYTES] += n; break;
	case K_POOL:
		if (p->alloc_type == 2) {
			stats[ST_MANAGED_BYTES] += n;
		} else if (pool_dev_bytes(p)) {
			stats[ST_DEVICE_BYTES] += n;
			if (p->loc_id == 1) stats[ST_DEVICE_BYTES_1] += n;
		} else {
			stats[ST_PINNED_BYTES] += n;
		}
		break;
	}
}

static alloc_t *find_alloc(u64 p) {
	for (int i = 0; i < nallocs; i++)
		if (p >= allocs[i].base && p < allocs[i].base + (allocs[i].size ? allocs[i].size : 1)) return &allocs[i];
	return 0;
}

static alloc_t *find_base(u64 p) {
	for (int i = 0; i < nallocs; i++)
		if (allocs[i].base == p) return &allocs[i];
	return 0;
}

static void *map_shared(u64 len) {
	void *m = mmap(0, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	return m == MAP_FAILED ? 0 : m;
}

static u64 round_up(u64 n, u64 a) { return (n + a - 1) / a * a; }

static CUresult new_alloc(u64 *out, u64 size, int kind, int dev, pool_t *p) {
	if (size == 0) return E_INVALID_VALUE;
	if (size > total_mem) return E_OUT_OF_MEMORY;
	if ((kind == K_DEVICE || (kind == K_POOL && pool_dev_bytes(p))) &&
	    (u64)stats[ST_DEVICE_BYTES] + size > total_mem * (u64)ndev)
		return E_OUT_OF_MEMORY;
	if (nallocs == capallocs) {
		int c = capallocs ? capallocs * 2 : 64;
		alloc_t *a = realloc(allocs, c * sizeof *a);
		if (!a) return E_OUT_OF_MEMORY;
		allocs = a, capallocs = c;
	}
	u64 len = round_up(size, PAGE);
	void *m = 0;
	int memfd = -1;
	if (kind == K_POOL && (p->handle_types & 1) && !p->imported) {
		/* A pool another process may import: its memory is a memfd, which
		   the importer maps through /proc (see fMemPoolImportPointer). */
		memfd = memfd_create("fakecuda-pool", MFD_CLOEXEC);
		if (memfd < 0) return E_OUT_OF_MEMORY;
		if (ftruncate(memfd, (off_t)len) == 0) {
			m = mmap(0, len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd, 0);
			if (m == MAP_FAILED) m = 0;
		}
		if (!m) { close(memfd); return E_OUT_OF_MEMORY; }
	} else {
		m = map_shared(len);
		if (!m) return E_OUT_OF_MEMORY;
	}
	mpage_t *pages = 0;
	if (kind == K_MANAGED || (kind == K_POOL && p->alloc_type == 2)) {
		pages = calloc(len / PAGE, sizeof *pages);
		if (!pages) { munmap(m, len); if (memfd >= 0) close(memfd); return E_OUT_OF_MEMORY; }
		/* A managed pool's preferred location is its allocations'. */
		if (kind == K_POOL && p->loc_type >= 1 && p->loc_type <= 3)
			for (u64 i = 0; i < len / PAGE; i++) pages[i].pref_type = p->loc_type, pages[i].pref_id = p->loc_type == 2 ? 0 : p->loc_id;
	}
	allocs[nallocs++] = (alloc_t){(u64)m, size, len, kind, dev, p, memfd + 1, pages};
	add_bytes(kind, dev, p, (long long)size);
	stats[ST_ALLOCS]++;
	*out = (u64)m;
	return OK;
}

static void drop_alloc(alloc_t *a) {
	if (a->kind != K_REGISTERED) munmap((void *)a->base, a->maplen);
	if (a->memfd1) close(a->memfd1 - 1);
	free(a->pages);
	add_bytes(a->kind, a->dev, a->pool, -(long long)a->size);
	if (a->kind == K_REGISTERED) stats[ST_REGISTERED]--;
	else stats[ST_ALLOCS]--;
	*a = allocs[--nallocs];
}

/* ---- VMM ---- */
typedef struct handle {
	int fd;
	u64 size;
	unsigned char prop[32]; /* CUmemAllocationProp as given */
	int refs, maps, imported, dev_bytes, dev;
	u64 export_id; /* what its POSIX-fd exports carry (0: never exported) */
} handle_t;
#define MAXH 4096
static handle_t *handles[MAXH];
static int nhandles;

typedef struct { u64 base, size; } range_t;
#define MAXR 4096
static range_t resv[MAXR];
static int nresv;

typedef struct {
	u64 base, size;
	handle_t *h;
	int access[MAXDEV + 1]; /* per device; [MAXDEV] = host */
} mapping_t;
static mapping_t maps[MAXR];
static int nmaps;

static handle_t *as_handle(u64 h) {
	for (int i = 0; i < nhandles; i++)
		if ((u64)handles[i] == h) return handles[i];
	return 0;
}

static void handle_maybe_free(handle_t *h) {
	if (h->refs > 0 || h->maps > 0) return;
	close(h->fd);
	if (h->dev_bytes) {
		stats[ST_DEVICE_BYTES] -= h->size;
		if (h->dev == 1) stats[ST_DEVICE_BYTES_1] -= h->size;
	} else if (!h->imported) {
		stats[ST_PINNED_BYTES] -= h->size;
	}
	stats[ST_VMM_HANDLES]--;
	for (int i = 0; i < nhandles; i++)
		if (handles[i] == h) { handles[i] = handles[--nhandles]; break; }
	free(h);
}

/* covered reports whether [p, p+n) lies inside the union of reservations. */
static int covered(u64 p, u64 n) {
	u64 at = p, end = p + n;
	while (at < end) {
		int found = 0;
		for (int i = 0; i < nresv; i++)
			if (at >= resv[i].base && at < resv[i].base + resv[i].size) {
				at = resv[i].base + resv[i].size;
				found = 1;
				break;
			}
		if (!found) return 0;
	}
	return 1;
}

static mapping_t *find_map(u64 p) {
	for (int i = 0; i < nmaps; i++)
		if (p >= maps[i].base && p < maps[i].base + maps[i].size) return &maps[i];
	return 0;
}

/* mapped_rw reports whether [p, p+n) is mapped with access for the host
   copy (any device granted read-write), checking each mapping on the way. */
static int mapped_ok(u64 p, u64 n, int write) {
	u64 at = p, end = p + n;
	while (at < end) {
		mapping_t *m = find_map(at);
		if (!m) return 0;
		int acc = 0;
		for (int d = 0; d <= MAXDEV; d++) acc |= m->access[d];
		if (!(acc & 1) || (write && acc != 3)) return 0;
		at = m->base + m->size;
	}
	return 1;
}

/* ---- memory range checks for copies ---- */
/* device_range: [p, p+n) must be inside one allocation or mapped VMM memory. */
static CUresult device_range(u64 p, u64 n, int write) {
	if (n == 0) return OK;
	if (p + n < p) return E_INVALID_VALUE;
	alloc_t *a = find_alloc(p);
	if (a) {
		if (a->kind == K_REGISTERED) return OK;
		return p + n <= a->base + a->size ? OK : E_INVALID_VALUE;
	}
	if (covered(p, n)) return mapped_ok(p, n, write) ? OK : E_ILLEGAL_ADDRESS;
	return E_INVALID_VALUE;
}

/* any_range: a unified-addressing copy argument: known device memory must
   be in bounds; unknown addresses are taken as pageable host memory. */
static CUresult any_range(u64 p, u64 n, int write) {
	if (n == 0) return OK;
	if (!p) return E_INVALID_VALUE;
	if (find_alloc(p) || covered(p, 1)) return device_range(p, n, write);
	return OK;
}

/* ---- streams and events ---- */
#define MAXS 8192
typedef struct {
	int dev; int flags;
	ctx_t *ctx; void *green; /* the context (and green context) it belongs to */
	int cap, mode;      /* capture status (0 none, 1 active, 2 invalidated) and mode */
	void *cg;           /* the graph being captured */
	u64 capid;
	void *origin;       /* the stream that began the capture (itself, or the one it joined) */
	int rejoined;       /* a joined stream whose work the capture waited for */
} stream_t;
/* Stream capture hooks (defined in the "Stream capture and graphs"
   section): capture_op says whether async work on s is to be recorded
   (*captured) rather than run, or fails it; capture_sync is the same for
   calls that wait for s, which invalidate a capture. */
static CUresult capture_op(void *s, int *captured);
static CUresult capture_sync(void *s);
static CUresult capture_alloc(u64 *out, size_t n, void *s, int *captured);
static CUresult capture_free(u64 ptr, void *s, int *handled);
static int global_captures;
static void invalidate_global(void);
/* gop_t is a data node: what a captured copy, fill or kernel launch does
   when the graph runs. */
enum { GOP_COPY, GOP_FILL, GOP_KERNEL };
typedef struct gop {
	int kind;
	u64 dst, src, n; /* copy: bytes; fill: elements of w bytes */
	int dk, sk;      /* copy: what dst and src may be (see copy) */
	unsigned v; int w; /* fill: the value and its width */
	int kern; u64 args[4]; /* kernel: which (see kernels) and its parameters */
} gop_t;
/* graph_add_op appends a data node to the graph stream s captures into;
   op_check reports whether op's memory is there to run it (a node's may
   have been freed since its capture); op_run runs it. */
static CUresult graph_add_op(void *s, const gop_t *op);
static CUresult op_check(const gop_t *op);
static void op_run(const gop_t *op);
static stream_t *streams[MAXS];
static int nstreams;
typedef struct {
	int dev; int recorded; ctx_t *ctx;
	void *cg; void *src; /* the capture (graph) and stream a captured record went into */
} event_t;
static event_t *events[MAXS];
static int nevents;

static int valid_stream(void *s) {
	if (s == 0 || s == (void *)1 || s == (void *)2) return 1; /* legacy / per-thread */
	for (int i = 0; i < nstreams; i++)
		if (streams[i] == s) return !streams[i]->ctx || !streams[i]->ctx->dead; /* a destroyed green context's streams are dead */
	return 0;
}
static event_t *as_event(void *e) {
	for (int i = 0; i < nevents; i++)
		if (events[i] == e) return events[i];
	return 0;
}

#define NEED_CTX() do { if (!initialized) { UNLOCK(); return E_NOT_INITIALIZED; } \
	if (!current || current->dead) { UNLOCK(); return E_INVALID_CONTEXT; } } while (0)
#define NEED_STREAM(s) do { if (!valid_stream(s)) { UNLOCK(); return E_INVALID_HANDLE; } } while (0)
#define RET(r) do { CUresult r_ = (r); UNLOCK(); return r_; } while (0)

/* ---- the test API ---- */
long long fakecuda_stat(int i) {
	LOCK();
	long long v = i >= 0 && i < ST_N ? stats[i] : -1;
	UNLOCK();
	return v;
}

/* ---- bootstrap ---- */
CUresult cuDriverGetVersion(int *v) {
	const char *e = getenv("FAKECUDA_VERSION");
	if (e && *e) driver_version = atoi(e);
	if (!v) return E_INVALID_VALUE;
	*v = driver_version;
	return OK;
}

CUresult cuInit(unsigned int flags) {
	if (flags) return E_INVALID_VALUE;
	LOCK();
	const char *e = getenv("FAKECUDA_DEVICES");
	if (e && *e) ndev = atoi(e);
	if (ndev < 1) ndev = 1;
	if (ndev > MAXDEV) ndev = MAXDEV;
	e = getenv("FAKECUDA_TOTAL_MEM");
	if (e && *e) total_mem = strtoull(e, 0, 10);
	if (!initialized) {
		for (int i = 0; i < MAXDEV; i++) {
			default_pool[i] = (pool_t){.alloc_type = 1, .loc_type = 1, .loc_id = i, .is_default = 1,
				.reuse = {1, 1, 1}, .live = 1, .id = 0};
			default_pool[i].access[i] = 3;
			current_pool[i] = &default_pool[i];
		}
		default_managed = (pool_t){.alloc_type = 2, .is_default = 1, .reuse = {1, 1, 1}, .live = 1, .id = 0};
		for (int i = 0; i < MAXDEV; i++) default_managed.access[i] = 3;
	}
	initialized = 1;
	UNLOCK();
	return OK;
}

/* ---- devices ---- */
static int bad_dev(int d) { return !initialized || d < 0 || d >= ndev; }

static CUresult fDeviceGetCount(int *n) {
	if (!initialized) return E_NOT_INITIALIZED;
	if (!n) return E_INVALID_VALUE;
	*n = ndev;
	return OK;
}
static CUresult fDeviceGet(int *d, int ord) {
	if (!d) return E_INVALID_VALUE;
	if (bad_dev(ord)) return E_INVALID_DEVICE;
	*d = ord;
	return OK;
}
static CUresult fDeviceGetName(char *buf, int len, int d) {
	if (bad_dev(d)) return E_INVALID_DEVICE;
	if (!buf || len <= 0) return E_INVALID_VALUE;
	/* Says what it is wherever a device's name is shown. */
	const char *name = d == 0 ? "cudamem fake GPU 0 (host memory)" : "cudamem fake GPU 1 (host memory)";
	strncpy(buf, name, len - 1);
	buf[len - 1] = 0;
	return OK;
}
static CUresult fDeviceGetUuid(unsigned char *u, int d) {
	if (bad_dev(d)) return E_INVALID_DEVICE;
	if (!u) return E_INVALID_VALUE;
	for (int i = 0; i < 16; i++) u[i] = (unsigned char)(0xf0 + i + 16 * d);
	return OK;
}
static CUresult fDeviceTotalMem(size_t *n, int d) {
	if (bad_dev(d)) return E_INVALID_DEVICE;
	if (!n) return E_INVALID_VALUE;
	*n = total_mem;
	return OK;
}
static CUresult fDeviceGetAttribute(int *v, int attr, int d) {
	if (bad_dev(d)) return E_INVALID_DEVICE;
	if (!v) return E_INVALID_VALUE;
	switch (attr) {
	case 75: *v = 9; break;         /* compute capability major */
	case 76: *v = 0; break;         /* minor */
	case 16: *v = 132; break;       /* multiprocessors */
	case 89: *v = !no_concurrent_managed(); break; /* concurrent managed access */
	case 19: case 41: case 83: case 99: case 102: case 103: case 115: case 116: case 110:
		*v = 1; break;              /* map host, UVA, managed, concurrent managed, register, VMM, POSIX fd, pools, RDMA, RDMA+VMM */
	case 88: *v = 0; break;         /* pageable memory access */
	case 119: *v = 1 | (fabric_mode() != 2 ? 8 : 0); break; /* pool handle types: POSIX fd (+ fabric) */
	case 128: *v = fabric_mode() != 2; break; /* fabric handles (see fabric_mode) */
	case 134: *v = 0; break;        /* host NUMA id */
	default: *v = 0;
	}
	return OK;
}
static CUresult fDeviceCanAccessPeer(int *can, int d, int peer) {
	if (bad_dev(d) || bad_dev(peer)) return E_INVALID_DEVICE;
	if (!can) return E_INVALID_VALUE;
	*can = d != peer;
	return OK;
}
static CUresult fDeviceGetPCIBusId(char *buf, int len, int d) {
	if (bad_dev(d)) return E_INVALID_DEVICE;
	if (!buf || len < 13) return E_INVALID_VALUE;
	strcpy(buf, d == 0 ? "0000:01:00.0" : "0000:02:00.0");
	return OK;
}
static CUresult fDeviceGetDefaultMemPool(void **p, int d) {
	if (bad_dev(d)) return E_INVALID_DEVICE;
	if (!p) return E_INVALID_VALUE;
	*p = &default_pool[d];
	return OK;
}
static CUresult fDeviceGetMemPool(void **p, int d) {
	if (bad_dev(d)) return E_INVALID_DEVICE;
	if (!p) return E_INVALID_VALUE;
	LOCK();
	*p = current_pool[d];
	RET(OK);
}
/* cuMemGetMemPool (CUDA 13.0): a device's current pool, and the default
   managed pool with no preferred location; host pools are not emulated. */
static CUresult fMemGetMemPool(void **p, const int *loc, int type) {
	if (!initialized) return E_NOT_INITIALIZED;
	if (!p || !loc) return E_INVALID_VALUE;
	LOCK();
	if (type == 1 && loc[0] == 1 && !bad_dev(loc[1])) { *p = current_pool[loc[1]]; RET(OK); }
	if (type == 2 && loc[0] == 0) {
		if (no_concurrent_managed()) RET(E_NOT_SUPPORTED);
		*p = &default_managed;
		RET(OK);
	}
	RET(E_INVALID_VALUE);
}
static CUresult fDeviceSetMemPool(int d, void *p) {
	if (bad_dev(d)) return E_INVALID_DEVICE;
	LOCK();
	pool_t *pp = as_pool(p);
	if (!pp || pp->imported || pp->loc_type != 1 || pp->loc_id != d) RET(E_INVALID_VALUE);
	current_pool[d] = pp;
	RET(OK);
}

/* ---- contexts ---- */
static CUresult fPrimaryCtxRetain(void **c, int d) {
	if (bad_dev(d)) return E_INVALID_DEVICE;
	if (!c) return E_INVALID_VALUE;
	LOCK();
	ctxs[d].retains++;
	stats[ST_CTX_RETAINS]++;
	*c = &ctxs[d];
	RET(OK);
}
static CUresult fPrimaryCtxRelease(int d) {
	if (bad_dev(d)) return E_INVALID_DEVICE;
	LOCK();
	if (ctxs[d].retains == 0) RET(E_INVALID_CONTEXT);
	ctxs[d].retains--;
	stats[ST_CTX_RETAINS]--;
	RET(OK);
}
static CUresult fCtxSetCurrent(void *c) {
	if (!initialized) return E_NOT_INITIALIZED;
	if (c == 0) { current = 0; return OK; }
	ctx_t *x = as_ctx(c);
	if (!x && dead_made(c)) crash();
	if (!x || x->retains == 0) return E_INVALID_CONTEXT;
	current = x;
	return OK;
}
static CUresult fCtxGetCurrent(void **c) {
	if (!c) return E_INVALID_VALUE;
	*c = current;
	return OK;
}
static CUresult fCtxGetDevice(int *d) {
	if (!d) return E_INVALID_VALUE;
	if (!current || current->dead) return E_INVALID_CONTEXT;
	*d = current->dev;
	return OK;
}
static void invalidate_ctx(ctx_t *c);
/* Waiting for the whole context while one of its streams captures
   invalidates that capture, as on a real driver. */
static CUresult fCtxSynchronize(void) {
	LOCK();
	NEED_CTX();
	for (int i = 0; i < nstreams; i++)
		if (streams[i]->cap == 1 && streams[i]->ctx == current) { invalidate_ctx(current); RET(E_CAPTURE_UNSUPPORTED); }
	RET(OK);
}
static CUresult fCtxEnablePeerAccess(void *peer, unsigned flags) {
	LOCK();
	NEED_CTX();
	ctx_t *p = as_ctx(peer);
	if (!p || flags) RET(E_INVALID_VALUE);
	if (p == current) RET(E_INVALID_DEVICE);
	if (current->peer[p->dev]) RET(E_PEER_ALREADY);
	current->peer[p->dev] = 1;
	RET(OK);
}
static CUresult fCtxDisablePeerAccess(void *peer) {
	LOCK();
	NEED_CTX();
	ctx_t *p = as_ctx(peer);
	if (!p) RET(E_INVALID_VALUE);
	if (!current->peer[p->dev]) RET(E_PEER_NOT_ENABLED);
	current->peer[p->dev] = 0;
	RET(OK);
}
static CUresult fCtxGetStreamPriorityRange(int *least, int *greatest) {
	if (!current) return E_INVALID_CONTEXT;
	if (least) *least = 0;
	if (greatest) *greatest = -5;
	return OK;
}

/* ---- streams and events ---- */
static CUresult fStreamCreateWithPriority(void **s, unsigned flags, int prio) {
	LOCK();
	NEED_CTX();
	if (!s || flags > 1 || nstreams == MAXS) RET(E_INVALID_VALUE);
	stream_t *st = malloc(sizeof *st);
	if (!st) RET(E_OUT_OF_MEMORY);
	memset(st, 0, sizeof *st);
	st->dev = current->dev;
	st->flags = (int)flags;
	st->ctx = current;
	st->green = current->green;
	streams[nstreams++] = st;
	stats[ST_STREAMS]++;
	*s = st;
	RET(OK);
}
static CUresult fStreamCreate(void **s, unsigned flags) { return fStreamCreateWithPriority(s, flags, 0); }
static CUresult fStreamDestroy(void *s) {
	LOCK();
	NEED_CTX();
	for (int i = 0; i < nstreams; i++)
		if (streams[i] == s) {
			if (streams[i]->ctx && streams[i]->ctx->dead) RET(E_INVALID_CONTEXT); /* leaked, as CUDA does */
			if (streams[i]->cap) RET(E_ILLEGAL_STATE); /* end the capture first */
			free(s);
			streams[i] = streams[--nstreams];
			stats[ST_STREAMS]--;
			RET(OK);
		}
	RET(E_INVALID_HANDLE);
}
static CUresult fStreamSynchronize(void *s) {
	LOCK();
	NEED_CTX();
	NEED_STREAM(s);
	RET(capture_sync(s));
}
static CUresult fStreamQuery(void *s) { return fStreamSynchronize(s); }
static CUresult fStreamGetFlags(void *s, unsigned *flags) {
	LOCK();
	if (!flags) RET(E_INVALID_VALUE);
	for (int i = 0; i < nstreams; i++)
		if (streams[i] == s) { *flags = (unsigned)streams[i]->flags; RET(OK); }
	if (!s || s == (void *)1) { *flags = 0; RET(OK); } /* the legacy stream blocks */
	RET(E_INVALID_HANDLE);
}
static stream_t *as_stream(void *s);
static void invalidate(stream_t *st);
static int capture_live(void *cg);
static CUresult legacy_guard(void *s);
static void graph_node(void *g);
/* Waits under capture follow the driver's rules: waiting on an event
   recorded into a capture joins the waiting stream to it; a capturing
   stream waiting on an event recorded outside its capture (without the
   external flag) or into another capture is an isolation error that
   invalidates the capture. */
static CUresult fStreamWaitEvent(void *s, void *e, unsigned flags) {
	LOCK();
	NEED_CTX();
	NEED_STREAM(s);
	event_t *ev = as_event(e);
	if (!ev) RET(E_INVALID_HANDLE);
	stream_t *st = as_stream(s);
	void *ecg = ev->cg && capture_live(ev->cg) ? ev->cg : 0;
	if (st && st->cap == 2) RET(E_CAPTURE_INVALIDATED);
	int capturing = st && st->cap == 1;
	if (!ecg && !capturing) RET(legacy_guard(s));
	if (ecg && capturing && st->cg == ecg) {
		/* A wait inside the capture: joins back a forked stream. */
		stream_t *src = as_stream(ev->src);
		if (src && src->cg == ecg && src != st->origin) src->rejoined = 1;
		graph_node(ecg);
		RET(OK);
	}
	if (ecg && !capturing) {
		if (!st) { /* the legacy stream cannot join a capture */
			stream_t *o = as_stream(ev->src);
			if (o) invalidate(o);
			RET(E_CAPTURE_IMPLICIT);
		}
		stream_t *o = as_stream(ev->src);
		st->cap = 1, st->cg = ecg, st->mode = o ? o->mode : 2, st->capid = o ? o->capid : 0;
		st->origin = o ? o->origin : 0, st->rejoined = 0;
		RET(OK);
	}
	/* A capture waiting on work outside it, or on another capture. */
	invalidate(st);
	if (ecg) { stream_t *o = as_stream(ev->src); if (o) invalidate(o); }
	RET(E_CAPTURE_ISOLATION);
}
static CUresult fEventCreate(void **e, unsigned flags) {
	LOCK();
	NEED_CTX();
	if (!e || nevents == MAXS) RET(E_INVALID_VALUE);
	event_t *ev = calloc(1, sizeof *ev);
	if (!ev) RET(E_OUT_OF_MEMORY);
	ev->dev = current->dev;
	ev->ctx = current;
	events[nevents++] = ev;
	stats[ST_EVENTS]++;
	*e = ev;
	RET(OK);
}
static CUresult fEventDestroy(void *e) {
	LOCK();
	NEED_CTX();
	for (int i = 0; i < nevents; i++)
		if (events[i] == e) {
			free(e);
			events[i] = events[--nevents];
			stats[ST_EVENTS]--;
			RET(OK);
		}
	RET(E_INVALID_HANDLE);
}
static CUresult fEventRecord(void *e, void *s) {
	LOCK();
	NEED_CTX();
	NEED_STREAM(s);
	event_t *ev = as_event(e);
	if (!ev) RET(E_INVALID_HANDLE);
	/* An event and the stream it is recorded on share a context. */
	stream_t *st = as_stream(s);
	if (ev->ctx != (st ? st->ctx : current)) RET(E_INVALID_HANDLE);
	int captured = 0;
	CUresult cr = capture_op(s, &captured);
	if (cr) RET(cr);
	ev->recorded = 1;
	ev->cg = captured ? st->cg : 0;
	ev->src = captured ? st : 0;
	RET(OK);
}
/* Waiting for or querying an event last recorded into a capture still in
   progress is illegal. */
static CUresult fEventSynchronize(void *e) {
	LOCK();
	NEED_CTX();
	event_t *ev = as_event(e);
	if (!ev) RET(E_INVALID_HANDLE);
	if (ev->cg && capture_live(ev->cg)) RET(E_CAPTURED_EVENT);
	RET(OK);
}
static CUresult fEventQuery(void *e) { return fEventSynchronize(e); }
static CUresult fEventElapsedTime(float *ms, void *a, void *b) {
	LOCK();
	NEED_CTX();
	event_t *x = as_event(a), *y = as_event(b);
	if (!ms) RET(E_INVALID_VALUE);
	if (!x || !y || !x->recorded || !y->recorded) RET(E_INVALID_HANDLE);
	*ms = 0.001f;
	RET(OK);
}

/* ---- allocation ---- */
static CUresult fMemGetInfo(size_t *fr, size_t *tot) {
	LOCK();
	NEED_CTX();
	if (!fr || !tot) RET(E_INVALID_VALUE);
	u64 used = current->dev == 1 ? stats[ST_DEVICE_BYTES_1] : stats[ST_DEVICE_BYTES] - stats[ST_DEVICE_BYTES_1];
	*tot = total_mem;
	*fr = used > total_mem ? 0 : total_mem - used;
	RET(OK);
}
static CUresult fMemAlloc(u64 *p, size_t n) {
	LOCK();
	NEED_CTX();
	if (!p) RET(E_INVALID_VALUE);
	/* An unsafe call during a global-mode capture on any thread
	   invalidates that capture (the reason cudamem defaults to relaxed). */
	if (global_captures) { invalidate_global(); RET(E_CAPTURE_UNSUPPORTED); }
	RET(new_alloc(p, n, K_DEVICE, current->dev, 0));
}
static CUresult free_kind(u64 p, int k1, int k2) {
	if (p == 0) return OK; /* freeing NULL is allowed */
	alloc_t *a = find_base(p);
	if (!a || (a->kind != k1 && a->kind != k2)) return E_INVALID_VALUE;
	drop_alloc(a);
	return OK;
}
static CUresult fMemFree(u64 p) {
	LOCK();
	NEED_CTX();
	RET(free_kind(p, K_DEVICE, K_MANAGED));
}
static CUresult fMemAllocHost(void **p, size_t n) {
	LOCK();
	NEED_CTX();
	if (!p) RET(E_INVALID_VALUE);
	RET(new_alloc((u64 *)p, n, K_PINNED, -1, 0));
}
static CUresult fMemHostAlloc(void **p, size_t n, unsigned flags) {
	if (flags & ~7u) return E_INVALID_VALUE;
	return fMemAllocHost(p, n);
}
static CUresult fMemFreeHost(void *p) {
	LOCK();
	NEED_CTX();
	if (!p) RET(E_INVALID_VALUE);
	RET(free_kind((u64)p, K_PINNED, K_PINNED));
}
static CUresult fMemHostGetDevicePointer(u64 *d, void *p, unsigned flags) {
	LOCK();
	NEED_CTX();
	alloc_t *a = find_alloc((u64)p);
	if (!d || flags || !a || (a->kind != K_PINNED && a->kind != K_REGISTERED)) RET(E_INVALID_VALUE);
	*d = (u64)p;
	RET(OK);
}
static CUresult fMemHostRegister(void *p, size_t n, unsigned flags) {
	LOCK();
	NEED_CTX();
	if (!p || n == 0 || (u64)p + n < (u64)p) RET(E_INVALID_VALUE);
	if (find_alloc((u64)p) || find_alloc((u64)p + n - 1)) RET(E_INVALID_VALUE); /* already registered / pinned */
	if (nallocs == capallocs) {
		int c = capallocs ? capallocs * 2 : 64;
		alloc_t *a = realloc(allocs, c * sizeof *a);
		if (!a) RET(E_OUT_OF_MEMORY);
		allocs = a, capallocs = c;
	}
	allocs[nallocs++] = (alloc_t){(u64)p, n, 0, K_REGISTERED, -1, 0};
	stats[ST_REGISTERED]++;
	RET(OK);
}
static CUresult fMemHostUnregister(void *p) {
	LOCK();
	NEED_CTX();
	alloc_t *a = find_base((u64)p);
	if (!a || a->kind != K_REGISTERED) RET(E_INVALID_VALUE);
	drop_alloc(a);
	RET(OK);
}
static CUresult fMemAllocManaged(u64 *p, size_t n, unsigned flags) {
	LOCK();
	NEED_CTX();
	if (!p || (flags != 1 && flags != 2)) RET(E_INVALID_VALUE);
	RET(new_alloc(p, n, K_MANAGED, current->dev, 0));
}
/* no_concurrent_managed: FAKECUDA_NO_CONCURRENT_MANAGED=1 plays devices
   without concurrent managed access (attribute 89 is 0): prefetches to a
   device, advice naming a device and the batched calls are refused, as
   the driver documents. */
static int no_concurrent_managed(void) {
	const char *e = getenv("FAKECUDA_NO_CONCURRENT_MANAGED");
	return e && !strcmp(e, "1");
}
/* managed_range finds the managed allocation that holds [p, p+n) and the
   pages it covers (first and one past the last). Called with the lock held. */
static alloc_t *managed_range(u64 p, u64 n, u64 *first, u64 *end) {
	alloc_t *a = find_alloc(p);
	if (!a || !is_managed(a) || n == 0 || p + n < p || p + n > a->base + a->size) return 0;
	*first = (p - a->base) / PAGE;
	*end = (p + n - 1 - a->base) / PAGE + 1;
	return a;
}
/* resolve_loc checks a prefetch or preferred location (loc packed as the
   _v2 entry points take it, type low and id high) and says where it
   lands: the host is type 2, a NUMA node type 3 (the fake has node 0
   only; the calling thread's node is node 0). */
static CUresult resolve_loc(u64 loc, int *type, int *id) {
	int lt = (int)(loc & 0xffffffff), li = (int)(loc >> 32);
	switch (lt) {
	case 1:
		if (bad_dev(li)) return E_INVALID_DEVICE;
		if (no_concurrent_managed()) return E_INVALID_DEVICE;
		*type = 1, *id = li;
		return OK;
	case 2: *type = 2, *id = 0; return OK;
	case 3: if (li != 0) return E_INVALID_VALUE; *type = 3, *id = 0; return OK;
	case 4: *type = 3, *id = 0; return OK;
	}
	return E_INVALID_VALUE;
}
static CUresult fMemPrefetchAsync(u64 p, size_t n, u64 loc, unsigned flags, void *s) {
	LOCK();
	NEED_CTX();
	NEED_STREAM(s);
	u64 first, end;
	alloc_t *a = managed_range(p, n, &first, &end);
	if (!a || flags) RET(E_INVALID_VALUE);
	int t, id;
	CUresult r = resolve_loc(loc, &t, &id);
	if (r) RET(r);
	for (u64 i = first; i < end; i++) a->pages[i].last_type = t, a->pages[i].last_id = id;
	RET(OK);
}
static CUresult fMemAdvise(u64 p, size_t n, int advice, u64 loc) {
	LOCK();
	NEED_CTX();
	u64 first, end;
	alloc_t *a = managed_range(p, n, &first, &end);
	if (!a || advice < 1 || advice > 6) RET(E_INVALID_VALUE);
	int lt = (int)(loc & 0xffffffff), li = (int)(loc >> 32), t = 0, id = 0;
	unsigned bit = 0;
	switch (advice) {
	case 3: {
		CUresult r = resolve_loc(loc, &t, &id);
		if (r) RET(r);
		break;
	}
	case 5: case 6:
		/* Accessed-by takes a device or the host, nothing else. */
		if (lt == 1 && !bad_dev(li)) {
			if (no_concurrent_managed()) RET(E_INVALID_DEVICE);
			bit = 1u << li;
		} else if (lt == 2) {
			bit = 1u << MAXDEV;
		} else {
			RET(E_INVALID_VALUE);
		}
		break;
	default:
		/* The location is ignored, but must be valid, as on the driver. */
		if (lt < 1 || lt > 4 || (lt == 1 && bad_dev(li))) RET(E_INVALID_VALUE);
	}
	for (u64 i = first; i < end; i++) {
		mpage_t *pg = &a->pages[i];
		switch (advice) {
		case 1: pg->read_mostly = 1; break;
		case 2: pg->read_mostly = 0; break;
		case 3: pg->pref_type = t, pg->pref_id = id; break;
		case 4: pg->pref_type = 0, pg->pref_id = 0; break;
		case 5: pg->accessed |= bit; break;
		case 6: pg->accessed &= ~bit; break;
		}
	}
	RET(OK);
}
/* cuMemRangeGetAttribute: a value holds for the range when every page
   has it; otherwise the driver's "none" (invalid location, -2 device). */
static CUresult fMemRangeGetAttribute(void *data, size_t size, int attr, u64 p, size_t n) {
	LOCK();
	NEED_CTX();
	u64 first, end;
	alloc_t *a = managed_range(p, n, &first, &end);
	if (!a || !data) RET(E_INVALID_VALUE);
	if (attr == 3 ? (size == 0 || size % 4) : size != 4) RET(E_INVALID_VALUE);
	mpage_t *pg = a->pages;
	int same_pref = 1, same_last = 1, rm = 1;
	unsigned acc = ~0u;
	for (u64 i = first; i < end; i++) {
		same_pref &= pg[i].pref_type == pg[first].pref_type && pg[i].pref_id == pg[first].pref_id;
		same_last &= pg[i].last_type == pg[first].last_type && pg[i].last_id == pg[first].last_id;
		rm &= pg[i].read_mostly;
		acc &= pg[i].accessed;
	}
	int pt = same_pref ? pg[first].pref_type : 0, pi = same_pref ? pg[first].pref_id : 0;
	int lt = same_last ? pg[first].last_type : 0, li = same_last ? pg[first].last_id : 0;
	int *out = data;
	switch (attr) {
	case 1: *out = rm; break;
	case 2: *out = pt == 1 ? pi : pt == 2 || pt == 3 ? -1 : -2; break;
	case 4: *out = lt == 1 ? li : lt == 2 || lt == 3 ? -1 : -2; break;
	case 5: *out = pt; break;
	case 6: *out = pi; break;
	case 7: *out = lt; break;
	case 8: *out = li; break;
	case 3: {
		size_t k = 0, cap = size / 4;
		for (int d = 0; d < ndev && k < cap; d++)
			if (acc & (1u << d)) out[k++] = d;
		if (k < cap && (acc & (1u << MAXDEV))) out[k++] = -1;
		while (k < cap) out[k++] = -2;
		break;
	}
	default: RET(E_INVALID_VALUE);
	}
	RET(OK);
}
/* The batched calls (CUDA 13.0) check the whole batch before touching
   any of it. A discard scribbles over the range: its contents are
   indeterminate until written or prefetched, and nothing may rely on
   them. */
typedef struct { int type, id; } bloc_t;
static CUresult managed_batch(const u64 *ptrs, const size_t *sizes, size_t count, const bloc_t *locs,
                              const size_t *idxs, size_t nlocs, u64 flags, void *s, int discard, int prefetch) {
	LOCK();
	NEED_CTX();
	NEED_STREAM(s);
	if (s == 0 || s == (void *)1) RET(E_INVALID_VALUE); /* not the legacy stream */
	if (!ptrs || !sizes || count == 0 || flags) RET(E_INVALID_VALUE);
	if (no_concurrent_managed()) RET(E_NOT_SUPPORTED);
	int captured = 0;
	CUresult cr = capture_op(s, &captured);
	if (cr) RET(cr);
	if (captured) RET(E_CAPTURE_UNSUPPORTED);
	if (prefetch) {
		if (!locs || !idxs || nlocs == 0 || nlocs > count || idxs[0] != 0) RET(E_INVALID_VALUE);
		for (size_t k = 0; k < nlocs; k++) {
			int t, id;
			if ((k > 0 && idxs[k] <= idxs[k - 1]) || idxs[k] >= count) RET(E_INVALID_VALUE);
			CUresult r = resolve_loc((u64)(unsigned)locs[k].type | (u64)(unsigned)locs[k].id << 32, &t, &id);
			if (r) RET(r);
		}
	}
	for (size_t i = 0; i < count; i++) {
		u64 first, end;
		if (!managed_range(ptrs[i], sizes[i], &first, &end)) RET(E_INVALID_VALUE);
	}
	size_t k = 0;
	for (size_t i = 0; i < count; i++) {
		u64 first, end;
		alloc_t *a = managed_range(ptrs[i], sizes[i], &first, &end);
		if (discard) memset((void *)ptrs[i], 0xdb, sizes[i]);
		if (!prefetch) continue;
		while (k + 1 < nlocs && idxs[k + 1] <= i) k++;
		int t, id;
		resolve_loc((u64)(unsigned)locs[k].type | (u64)(unsigned)locs[k].id << 32, &t, &id);
		for (u64 j = first; j < end; j++) a->pages[j].last_type = t, a->pages[j].last_id = id;
	}
	RET(OK);
}
static CUresult fMemPrefetchBatchAsync(const u64 *ptrs, const size_t *sizes, size_t count, const bloc_t *locs,
                                       const size_t *idxs, size_t nlocs, u64 flags, void *s) {
	return managed_batch(ptrs, sizes, count, locs, idxs, nlocs, flags, s, 0, 1);
}
static CUresult fMemDiscardBatchAsync(const u64 *ptrs, const size_t *sizes, size_t count, u64 flags, void *s) {
	return managed_batch(ptrs, sizes, count, 0, 0, 0, flags, s, 1, 0);
}
static CUresult fMemDiscardAndPrefetchBatchAsync(const u64 *ptrs, const size_t *sizes, size_t count, const bloc_t *locs,
                                                 const size_t *idxs, size_t nlocs, u64 flags, void *s) {
	return managed_batch(ptrs, sizes, count, locs, idxs, nlocs, flags, s, 1, 1);
}
static CUresult fPointerGetAttribute(void *data, int attr, u64 p) {
	LOCK();
	if (!data) RET(E_INVALID_VALUE);
	alloc_t *a = find_alloc(p);
	mapping_t *m = a ? 0 : find_map(p);
	if (!a && !m) RET(E_INVALID_VALUE);
	int dev = a ? (a->kind == K_POOL ? a->pool->loc_id : a->dev) : (m->h->dev);
	int host = a && (a->kind == K_PINNED || a->kind == K_REGISTERED || (a->kind == K_POOL && a->pool->loc_type != 1 && a->pool->alloc_type != 2));
	switch (attr) {
	case 1: *(void **)data = dev >= 0 ? &ctxs[dev] : 0; break;
	case 2: *(unsigned *)data = host ? 1 : 2; break;
	case 3: case 4: *(u64 *)data = p; break;
	case 8: *(int *)data = a && is_managed(a); break;
	case 9: *(int *)data = dev < 0 ? 0 : dev; break;
	case 11: *(u64 *)data = a ? a->base : m->base; break;
	case 12: *(size_t *)data = a ? a->size : m->size; break;
	case 17: *(void **)data = a && (a->kind == K_POOL || a->kind == K_IMPORT) ? (void *)a->pool : 0; break;
	default: RET(E_INVALID_VALUE);
	}
	RET(OK);
}

static CUresult fMemGetAddressRange(u64 *base, size_t *size, u64 p) {
	LOCK();
	NEED_CTX();
	alloc_t *a = find_alloc(p);
	mapping_t *m = a ? 0 : find_map(p);
	if (!a && !m) RET(E_INVALID_VALUE); /* the driver says not found, 500; callers only need an error */
	if (base) *base = a ? a->base : m->base;
	if (size) *size = a ? a->size : m->size;
	RET(OK);
}

/* ---- copies and fills ---- */
static CUresult copy(u64 dst, u64 src, size_t n, int dk, int sk, void *s, int async) {
	/* dk/sk: 0 = device (must be known), 1 = host (anything), 2 = unified */
	LOCK();
	NEED_CTX();
	if (async) NEED_STREAM(s);
	int captured = 0;
	/* A synchronous copy runs on the legacy stream: while a blocking
	   stream of the device captures, it joins and invalidates that
	   capture, as legacy-stream work does. */
	CUresult cr = async ? capture_op(s, &captured) : legacy_guard(0);
	if (cr) RET(cr);
	if (n == 0) RET(OK);
	if (!dst || !src) RET(E_INVALID_VALUE);
	CUresult r = dk == 0 ? device_range(dst, n, 1) : dk == 2 ? any_range(dst, n, 1) : OK;
	if (r) RET(r);
	r = sk == 0 ? device_range(src, n, 0) : sk == 2 ? any_range(src, n, 0) : OK;
	if (r) RET(r);
	gop_t op = {.kind = GOP_COPY, .dst = dst, .src = src, .n = n, .dk = dk, .sk = sk};
	/* A node keeps what its operands were at capture: memory the driver
	   knew must still be there at each launch (not be taken for pageable
	   host memory once freed). */
	if (dk == 2 && (find_alloc(dst) || covered(dst, 1))) op.dk = 0;
	if (sk == 2 && (find_alloc(src) || covered(src, 1))) op.sk = 0;
	if (captured) RET(graph_add_op(s, &op)); /* a memcpy node, run by each launch */
	op_run(&op);
	RET(OK);
}
static CUresult fMemcpy(u64 d, u64 s, size_t n) { return copy(d, s, n, 2, 2, 0, 0); }
static CUresult fMemcpyAsync(u64 d, u64 s, size_t n, void *st) { return copy(d, s, n, 2, 2, st, 1); }
static CUresult fMemcpyHtoD(u64 d, void *s, size_t n) { return copy(d, (u64)s, n, 0, 1, 0, 0); }
static CUresult fMemcpyDtoH(void *d, u64 s, size_t n) { return copy((u64)d, s, n, 1, 0, 0, 0); }
static CUresult fMemcpyDtoD(u64 d, u64 s, size_t n) { return copy(d, s, n, 0, 0, 0, 0); }
static CUresult fMemcpyHtoDAsync(u64 d, void *s, size_t n, void *st) { return copy(d, (u64)s, n, 0, 1, st, 1); }
static CUresult fMemcpyDtoHAsync(void *d, u64 s, size_t n, void *st) { return copy((u64)d, s, n, 1, 0, st, 1); }
static CUresult fMemcpyDtoDAsync(u64 d, u64 s, size_t n, void *st) { return copy(d, s, n, 0, 0, st, 1); }
static CUresult fMemcpyPeerAsync(u64 d, void *dc, u64 s, void *sc, size_t n, void *st) {
	if (!as_ctx(dc) || !as_ctx(sc)) return E_INVALID_CONTEXT;
	return copy(d, s, n, 0, 0, st, 1);
}
static CUresult fill(u64 p, unsigned v, size_t n, int w, void *s, int async) {
	LOCK();
	NEED_CTX();
	if (async) NEED_STREAM(s);
	int captured = 0;
	/* A synchronous fill runs on the legacy stream (see copy). */
	CUresult cr = async ? capture_op(s, &captured) : legacy_guard(0);
	if (cr) RET(cr);
	if (n == 0) RET(OK);
	if (n > (~0ull) / w || p % w) RET(E_INVALID_VALUE);
	CUresult r = device_range(p, n * w, 1);
	if (r) RET(r);
	gop_t op = {.kind = GOP_FILL, .dst = p, .n = n, .v = v, .w = w};
	if (captured) RET(graph_add_op(s, &op)); /* a memset node, run by each launch */
	op_run(&op);
	RET(OK);
}
static CUresult fMemsetD8(u64 p, unsigned char v, size_t n) { return fill(p, v, n, 1, 0, 0); }
static CUresult fMemsetD32(u64 p, unsigned v, size_t n) { return fill(p, v, n, 4, 0, 0); }
static CUresult fMemsetD8Async(u64 p, unsigned char v, size_t n, void *s) { return fill(p, v, n, 1, s, 1); }
static CUresult fMemsetD16Async(u64 p, unsigned short v, size_t n, void *s) { return fill(p, v, n, 2, s, 1); }
static CUresult fMemsetD32Async(u64 p, unsigned v, size_t n, void *s) { return fill(p, v, n, 4, s, 1); }

/* ---- pools ---- */
typedef struct {
	int alloc_type, handle_types, loc_type, loc_id;
	void *win32;
	size_t max_size;
	unsigned short usage;
	unsigned char reserved[54];
} pool_props_t;

static CUresult fMemPoolCreate(void **out, const pool_props_t *pr) {
	LOCK();
	NEED_CTX();
	if (!out || !pr || pr->alloc_type < 1 || pr->alloc_type > 2 || (pr->handle_types & ~9) || npools == MAXPOOLS) RET(E_INVALID_VALUE);
	if (pr->alloc_type == 2) {
		/* Managed pools (CUDA 13.0): no IPC; at no location (type 0), a
		   device, the host or a host NUMA node; devices need concurrent
		   managed access. */
		if (driver_version < 13000 || no_concurrent_managed()) RET(E_NOT_SUPPORTED);
		if (pr->handle_types || pr->loc_type < 0 || pr->loc_type > 3) RET(E_INVALID_VALUE);
		if (pr->loc_type == 1 && bad_dev(pr->loc_id)) RET(E_INVALID_VALUE);
		if (pr->loc_type == 3 && pr->loc_id != 0) RET(E_INVALID_VALUE);
		pool_t *p = calloc(1, sizeof *p);
		if (!p) RET(E_OUT_OF_MEMORY);
		*p = (pool_t){.alloc_type = 2, .loc_type = pr->loc_type, .loc_id = pr->loc_type == 1 || pr->loc_type == 3 ? pr->loc_id : 0,
			.max_size = pr->max_size, .reuse = {1, 1, 1}, .live = 1, .id = next_pool_id++};
		for (int d = 0; d < ndev; d++) p->access[d] = 3; /* managed memory: every device */
		pools[npools++] = p;
		stats[ST_POOLS]++;
		*out = p;
		RET(OK);
	}
	/* Without IMEX (fabric mode 0) a pool with fabric handles is made, at
	   any location type, as the real driver makes it; its export is
	   refused and destroying it is where the real driver crashes. */
	int doomed = 0;
	if (pr->handle_types & 8) {
		if (fabric_mode() == 2) RET(E_NOT_SUPPORTED);
		doomed = fabric_mode() == 0;
	}
	if (pr->loc_type == 1 && bad_dev(pr->loc_id)) RET(E_INVALID_VALUE);
	if (pr->loc_type != 1 && pr->loc_type != 2 && pr->loc_type != 3 && !(pr->loc_type == 4 && doomed)) RET(E_INVALID_VALUE);
	if (pr->loc_type == 3 && pr->loc_id != 0) RET(E_INVALID_VALUE); /* one NUMA node */
	pool_t *p = calloc(1, sizeof *p);
	if (!p) RET(E_OUT_OF_MEMORY);
	*p = (pool_t){.alloc_type = 1, .handle_types = pr->handle_types, .loc_type = pr->loc_type,
		.loc_id = pr->loc_type == 1 ? pr->loc_id : 0, .max_size = pr->max_size, .reuse = {1, 1, 1},
		.live = 1, .id = next_pool_id++, .doomed = doomed};
	if (p->loc_type == 1) p->access[p->loc_id] = 3;
	pools[npools++] = p;
	stats[ST_POOLS]++;
	*out = p;
	RET(OK);
}
static CUresult fMemPoolDestroy(void *h) {
	LOCK();
	NEED_CTX();
	pool_t *p = as_pool(h);
	if (!p || p->is_default) RET(E_INVALID_VALUE);
	if (p->doomed) {
		/* The real driver crashes the process here (SIGSEGV, or glibc's
		   "free(): invalid pointer"). The pool stays live and counted. */
		crash();
		RET(E_UNKNOWN);
	}
	for (int d = 0; d < ndev; d++)
		if (current_pool[d] == p) current_pool[d] = &default_pool[d];
	/* Memory still allocated from it stays valid until freed (the driver
	   defers the release); the pool object itself is gone. */
	p->live = 0;
	stats[ST_POOLS]--;
	RET(OK);
}
static CUresult fMemPoolGetAttribute(void *h, int attr, void *v) {
	LOCK();
	NEED_CTX();
	pool_t *p = as_pool(h);
	if (!p || !v) RET(E_INVALID_VALUE);
	switch (attr) {
	case 1: case 2: case 3: *(int *)v = p->reuse[attr - 1]; break;
	case 4: *(u64 *)v = p->threshold; break;
	case 5: *(u64 *)v = p->reserved; break;
	case 6: *(u64 *)v = p->reserved_high; break;
	case 7: *(u64 *)v = p->used; break;
	case 8: *(u64 *)v = p->used_high; break;
	default: RET(E_INVALID_VALUE);
	}
	RET(OK);
}
static CUresult fMemPoolSetAttribute(void *h, int attr, void *v) {
	LOCK();
	NEED_CTX();
	pool_t *p = as_pool(h);
	if (!p || !v || p->imported) RET(E_INVALID_VALUE);
	switch (attr) {
	case 1: case 2: case 3: p->reuse[attr - 1] = *(int *)v != 0; break;
	case 4: p->threshold = *(u64 *)v; break;
	case 6: if (*(u64 *)v) RET(E_INVALID_VALUE); p->reserved_high = p->reserved; break;
	case 8: if (*(u64 *)v) RET(E_INVALID_VALUE); p->used_high = p->used; break;
	default: RET(E_INVALID_VALUE);
	}
	RET(OK);
}
static CUresult fMemPoolTrimTo(void *h, size_t keep) {
	LOCK();
	NEED_CTX();
	pool_t *p = as_pool(h);
	if (!p) RET(E_INVALID_VALUE);
	u64 r = p->reserved < keep ? p->reserved : keep;
	p->reserved = r > p->used ? r : p->used;
	RET(OK);
}
typedef struct { int type, id; } loc_t;
typedef struct { loc_t loc; int flags; } access_t;
static CUresult fMemPoolSetAccess(void *h, const access_t *d, size_t n) {
	LOCK();
	NEED_CTX();
	pool_t *p = as_pool(h);
	if (!p || (!d && n)) RET(E_INVALID_VALUE);
	for (size_t i = 0; i < n; i++) {
		if (d[i].loc.type != 1 || bad_dev(d[i].loc.id) || d[i].flags < 0 || d[i].flags > 3 || d[i].flags == 2)
			RET(E_INVALID_VALUE);
		if (p->loc_type == 1 && d[i].loc.id == p->loc_id && d[i].flags != 3) RET(E_INVALID_DEVICE);
	}
	for (size_t i = 0; i < n; i++) p->access[d[i].loc.id] = d[i].flags;
	RET(OK);
}
static CUresult fMemPoolGetAccess(int *flags, void *h, const loc_t *loc) {
	LOCK();
	NEED_CTX();
	pool_t *p = as_pool(h);
	if (!p || !flags || !loc || loc->type != 1 || bad_dev(loc->id)) RET(E_INVALID_VALUE);
	*flags = p->access[loc->id];
	RET(OK);
}
static CUresult pool_alloc(u64 *out, size_t n, pool_t *p) {
	if (p->max_size && p->used + n > p->max_size) return E_OUT_OF_MEMORY;
	CUresult r = new_alloc(out, n, K_POOL, p->loc_type == 1 ? p->loc_id : -1, p);
	if (r) return r;
	p->used += n;
	if (p->used > p->used_high) p->used_high = p->used;
	if (p->used > p->reserved) p->reserved = p->used;
	if (p->reserved > p->reserved_high) p->reserved_high = p->reserved;
	return OK;
}
static CUresult fMemAllocAsync(u64 *out, size_t n, void *s) {
	LOCK();
	NEED_CTX();
	NEED_STREAM(s);
	if (!out) RET(E_INVALID_VALUE);
	int captured = 0;
	CUresult cr = capture_alloc(out, n, s, &captured);
	if (cr || captured) RET(cr);
	RET(pool_alloc(out, n, current_pool[current->dev]));
}
static CUresult fMemAllocFromPoolAsync(u64 *out, size_t n, void *h, void *s) {
	LOCK();
	NEED_CTX();
	NEED_STREAM(s);
	pool_t *p = as_pool(h);
	if (!out || !p) RET(E_INVALID_VALUE);
	if (p->imported) RET(E_INVALID_VALUE); /* imported pools only import */
	int captured = 0;
	CUresult cr = capture_alloc(out, n, s, &captured); /* a graph allocation node, as on a real driver */
	if (cr || captured) RET(cr);
	RET(pool_alloc(out, n, p));
}
static CUresult fMemFreeAsync(u64 ptr, void *s) {
	LOCK();
	NEED_CTX();
	NEED_STREAM(s);
	int handled = 0;
	CUresult cr = capture_free(ptr, s, &handled);
	if (cr || handled) RET(cr);
	alloc_t *a = find_base(ptr);
	if (!a || (a->kind != K_POOL && a->kind != K_IMPORT)) RET(E_INVALID_VALUE);
	pool_t *p = a->pool;
	if (a->kind == K_POOL) {
		p->used -= a->size;
		if (p->reserved > p->threshold) p->reserved = p->threshold > p->used ? p->threshold : p->used;
	}
	drop_alloc(a);
	RET(OK);
}

/* Pool IPC: the exported fd is an eventfd whose counter is the exporting
   process's id and the pool's (an anonymous inode, as the real driver's
   export is not a regular file, pipe or socket); an imported pool refers
   to the exporting pool by that id. In the same process an imported
   pointer is a second mapping of the same shared pages. In another
   process, it maps the memfd that backs the allocation in the exporter
   (an exported pointer names it), opened through /proc/PID/fd: so pool
   IPC works between processes of one user, while the exporter lives. */
#define POOL_ID_BITS 24
#define POOL_ID_MASK ((1ll << POOL_ID_BITS) - 1)
static CUresult fMemPoolExportToShareableHandle(void *out, void *h, int type, u64 flags) {
	LOCK();
	NEED_CTX();
	if (type == 8) RET(fabric_pool_export(out, h, flags));
	pool_t *p = as_pool(h);
	if (!out || !p || type != 1 || flags || !(p->handle_types & 1) || p->id <= 0 || p->id > POOL_ID_MASK) RET(E_INVALID_VALUE);
	if (p->imported) RET(E_INVALID_VALUE); /* only the owner exports */
	int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (fd < 0) RET(E_OUT_OF_MEMORY);
	uint64_t id = ((uint64_t)getpid() << POOL_ID_BITS) | (uint64_t)p->id;
	if (write(fd, &id, sizeof id) != sizeof id) { close(fd); RET(E_OUT_OF_MEMORY); }
	*(int *)out = fd;
	RET(OK);
}
/* pool_fd_id reads the pool id an exported fd carries: reading an eventfd
   takes its counter, which is written back at once (under the lock, so no
   other import sees it empty). 0 for anything else. */
static long long pool_fd_id(int fd) {
	uint64_t id = 0;
	if (read(fd, &id, sizeof id) != sizeof id || id == 0) return 0;
	if (write(fd, &id, sizeof id) != sizeof id) return 0;
	return (long long)id;
}
static CUresult fMemPoolImportFromShareableHandle(void **out, void *osh, int type, u64 flags) {
	LOCK();
	NEED_CTX();
	if (type == 8) RET(fabric_pool_import(out, osh, flags));
	int fd = (int)(intptr_t)osh;
	long long id = 0;
	if (!out || type != 1 || flags || npools == MAXPOOLS) RET(E_INVALID_VALUE);
	if ((id = pool_fd_id(fd)) <= 0) RET(E_INVALID_VALUE);
	int pid = (int)(id >> POOL_ID_BITS);
	id &= POOL_ID_MASK;
	if (pid <= 0 || id == 0) RET(E_INVALID_VALUE);
	if (pid != getpid()) {
		/* Another process's pool: its memory is reached through its
		   exported pointers. */
		pool_t *p = calloc(1, sizeof *p);
		if (!p) RET(E_OUT_OF_MEMORY);
		*p = (pool_t){.alloc_type = 1, .handle_types = 1, .loc_type = 1, .loc_id = current->dev, .reuse = {1, 1, 1},
			.imported = 1, .live = 1, .id = id, .remote_pid = pid};
		p->access[p->loc_id] = 3;
		pools[npools++] = p;
		stats[ST_POOLS]++;
		*out = p;
		RET(OK);
	}
	pool_t *origin = 0;
	for (int i = 0; i < npools; i++)
		if (pools[i]->id == id && !pools[i]->imported) origin = pools[i];
	if (!origin) RET(E_INVALID_VALUE);
	pool_t *p = calloc(1, sizeof *p);
	if (!p) RET(E_OUT_OF_MEMORY);
	*p = *origin;
	p->imported = 1;
	p->live = 1;
	p->used = p->used_high = p->reserved = p->reserved_high = 0;
	pools[npools++] = p;
	stats[ST_POOLS]++;
	*out = p;
	RET(OK);
}
/* An exported pointer (CUmemPoolPtrExportData, 64 bytes): the pool's id,
   the pointer and its size, and the exporting process and the memfd
   backing the allocation there (0 and -1 when none). */
typedef struct { u64 magic; long long pool; u64 ptr, size; int pid, memfd; unsigned char pad[24]; } export_t;
#define EXPORT_MAGIC 0x66616b6563756461ull
static CUresult fMemPoolExportPointer(export_t *out, u64 ptr) {
	LOCK();
	NEED_CTX();
	alloc_t *a = find_base(ptr);
	if (!out || !a || a->kind != K_POOL || !(a->pool->handle_types & 9)) RET(E_INVALID_VALUE);
	memset(out, 0, sizeof *out);
	*out = (export_t){EXPORT_MAGIC, a->pool->id, ptr, a->size, getpid(), a->memfd1 - 1, {0}};
	RET(OK);
}
/* import_remote maps an allocation of another process's pool: the memfd
   the descriptor names, opened through /proc (it must be one the fake
   made for a pool, as large as the allocation). Called with the lock held. */
static CUresult import_remote(u64 *out, pool_t *p, const export_t *d) {
	if (d->pid != p->remote_pid || d->memfd < 0 || d->size == 0 || d->size > total_mem) return E_INVALID_VALUE;
	char path[64], target[64] = {0};
	snprintf(path, sizeof path, "/proc/%d/fd/%d", d->pid, d->memfd);
	if (readlink(path, target, sizeof target - 1) < 0 || strncmp(target, "/memfd:fakecuda-pool", 20)) return E_INVALID_VALUE;
	int fd = open(path, O_RDWR | O_CLOEXEC);
	if (fd < 0) return E_INVALID_VALUE; /* the exporter exited, or freed it */
	u64 len = round_up(d->size, PAGE);
	struct stat st;
	void *m = MAP_FAILED;
	if (fstat(fd, &st) == 0 && (u64)st.st_size >= len) m = mmap(0, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (m == MAP_FAILED) return E_INVALID_VALUE;
	if (nallocs == capallocs) {
		int c = capallocs ? capallocs * 2 : 64;
		alloc_t *na = realloc(allocs, c * sizeof *na);
		if (!na) { munmap(m, len); return E_OUT_OF_MEMORY; }
		allocs = na, capallocs = c;
	}
	allocs[nallocs++] = (alloc_t){(u64)m, d->size, len, K_IMPORT, p->loc_id, p};
	stats[ST_ALLOCS]++;
	*out = (u64)m;
	return OK;
}
static CUresult fMemPoolImportPointer(u64 *out, void *h, const export_t *d) {
	LOCK();
	NEED_CTX();
	pool_t *p = as_pool(h);
	if (!out || !d || !p || !p->imported || d->magic != EXPORT_MAGIC || d->pool != p->id) RET(E_INVALID_VALUE);
	if (p->remote_pid) RET(import_remote(out, p, d));
	alloc_t *a = find_base(d->ptr);
	if (!a || a->kind != K_POOL || a->pool->id != p->id || a->size != d->size) RET(E_INVALID_VALUE);
	if (nallocs == capallocs) {
		int c = capallocs * 2;
		alloc_t *na = realloc(allocs, c * sizeof *na);
		if (!na) RET(E_OUT_OF_MEMORY);
		allocs = na, capallocs = c;
		a = find_base(d->ptr);
	}
	void *m = mremap((void *)a->base, 0, a->maplen, MREMAP_MAYMOVE);
	if (m == MAP_FAILED) RET(E_OUT_OF_MEMORY);
	allocs[nallocs++] = (alloc_t){(u64)m, a->size, a->maplen, K_IMPORT, a->dev, p};
	stats[ST_ALLOCS]++;
	*out = (u64)m;
	RET(OK);
}

/* ---- VMM ---- */
typedef struct {
	int type, handle_types;
	loc_t loc;
	void *win32;
	unsigned char flags[8];
} alloc_prop_t;

static CUresult check_prop(const alloc_prop_t *p) {
	if (!p || p->type != 1) return E_INVALID_VALUE;
	if (p->loc.type == 1) return bad_dev(p->loc.id) ? E_INVALID_DEVICE : OK;
	if (p->loc.type == 2 || p->loc.type == 3 || p->loc.type == 4) return OK;
	return E_INVALID_VALUE;
}
static CUresult fMemGetAllocationGranularity(size_t *g, const alloc_prop_t *p, int opt) {
	LOCK();
	NEED_CTX();
	CUresult r = check_prop(p);
	if (r) RET(r);
	if (!g || (opt != 0 && opt != 1)) RET(E_INVALID_VALUE);
	*g = GRAN;
	RET(OK);
}
static CUresult fMemCreate(u64 *out, size_t size, const alloc_prop_t *p, u64 flags) {
	LOCK();
	NEED_CTX();
	CUresult r = check_prop(p);
	if (r) RET(r);
	if (!out || flags || size == 0 || size % GRAN || nhandles == MAXH) RET(E_INVALID_VALUE);
	if (p->handle_types & ~0xb) RET(E_INVALID_VALUE);
	if (p->handle_types & 8) { CUresult g = fabric_gate(); if (g) RET(g); }
	int dev = p->loc.type == 1;
	if (size > total_mem || (dev && (u64)stats[ST_DEVICE_BYTES] + size > total_mem * (u64)ndev)) RET(E_OUT_OF_MEMORY);
	int fd = memfd_create("fakecuda-vmm", MFD_CLOEXEC);
	if (fd < 0) RET(E_OUT_OF_MEMORY);
	if (ftruncate(fd, (off_t)size) != 0) { close(fd); RET(E_OUT_OF_MEMORY); }
	handle_t *h = calloc(1, sizeof *h);
	if (!h) { close(fd); RET(E_OUT_OF_MEMORY); }
	h->fd = fd, h->size = size, h->refs = 1, h->dev_bytes = dev, h->dev = dev ? p->loc.id : -1;
	memcpy(h->prop, p, sizeof h->prop);
	handles[nhandles++] = h;
	stats[ST_VMM_HANDLES]++;
	if (dev) {
		stats[ST_DEVICE_BYTES] += size;
		if (h->dev == 1) stats[ST_DEVICE_BYTES_1] += size;
	} else {
		stats[ST_PINNED_BYTES] += size;
	}
	*out = (u64)h;
	RET(OK);
}
static CUresult fMemRelease(u64 hv) {
	LOCK();
	NEED_CTX();
	handle_t *h = as_handle(hv);
	if (!h || h->refs == 0) RET(E_INVALID_VALUE);
	h->refs--;
	handle_maybe_free(h);
	RET(OK);
}
static CUresult fMemAddressReserve(u64 *out, size_t size, size_t align, u64 hint, u64 flags) {
	LOCK();
	NEED_CTX();
	if (!out || size == 0 || size % GRAN || flags || nresv == MAXR) RET(E_INVALID_VALUE);
	if (align == 0) align = GRAN;
	if (align & (align - 1) || align % PAGE) RET(E_INVALID_VALUE);
	if (size > (1ull << 46) || align > (1ull << 40)) RET(E_OUT_OF_MEMORY);
	void *m = MAP_FAILED;
	int prot = PROT_NONE, fl = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
	if (hint && hint % align == 0) {
#ifdef MAP_FIXED_NOREPLACE
		m = mmap((void *)hint, size, prot, fl | MAP_FIXED_NOREPLACE, -1, 0);
#else
		m = mmap((void *)hint, size, prot, fl, -1, 0);
#endif
		if (m != MAP_FAILED && (u64)m != hint) { munmap(m, size); m = MAP_FAILED; }
	}
	if (m == MAP_FAILED) {
		u64 len = size + align;
		void *big = mmap(0, len, prot, fl, -1, 0);
		if (big == MAP_FAILED) RET(E_OUT_OF_MEMORY);
		u64 b = round_up((u64)big, align);
		if (b > (u64)big) munmap(big, b - (u64)big);
		if ((u64)big + len > b + size) munmap((void *)(b + size), (u64)big + len - (b + size));
		m = (void *)b;
	}
	resv[nresv++] = (range_t){(u64)m, size};
	stats[ST_RESERVATIONS]++;
	*out = (u64)m;
	RET(OK);
}
static CUresult fMemAddressFree(u64 p, size_t size) {
	LOCK();
	NEED_CTX();
	for (int i = 0; i < nresv; i++)
		if (resv[i].base == p && resv[i].size == size) {
			for (int j = 0; j < nmaps; j++)
				if (maps[j].base < p + size && maps[j].base + maps[j].size > p) RET(E_INVALID_VALUE); /* still mapped */
			munmap((void *)p, size);
			resv[i] = resv[--nresv];
			stats[ST_RESERVATIONS]--;
			RET(OK);
		}
	RET(E_INVALID_VALUE);
}
static CUresult fMemMap(u64 p, size_t size, size_t off, u64 hv, u64 flags) {
	LOCK();
	NEED_CTX();
	handle_t *h = as_handle(hv);
	if (!h || flags || size == 0 || p % GRAN || size % GRAN || off % GRAN || off + size > h->size || off + size < off)
		RET(E_INVALID_VALUE);
	if (!covered(p, size) || nmaps == MAXR) RET(E_INVALID_VALUE);
	for (int j = 0; j < nmaps; j++)
		if (maps[j].base < p + size && maps[j].base + maps[j].size > p) RET(E_INVALID_VALUE); /* overlap */
	void *m = mmap((void *)p, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, (off_t)off);
	if (m == MAP_FAILED) RET(E_OUT_OF_MEMORY);
	mapping_t mp = {p, size, h, {0}};
	maps[nmaps++] = mp;
	h->maps++;
	stats[ST_MAPPINGS]++;
	RET(OK);
}
static CUresult fMemUnmap(u64 p, size_t size) {
	LOCK();
	NEED_CTX();
	if (size == 0) RET(E_INVALID_VALUE);
	int any = 0;
	for (int j = 0; j < nmaps; j++)
		if (maps[j].base < p + size && maps[j].base + maps[j].size > p) {
			if (maps[j].base < p || maps[j].base + maps[j].size > p + size) RET(E_INVALID_VALUE); /* partial */
			any = 1;
		}
	if (!any) RET(E_INVALID_VALUE);
	for (int j = 0; j < nmaps;) {
		if (maps[j].base < p + size && maps[j].base + maps[j].size > p) {
			mmap((void *)maps[j].base, maps[j].size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
			handle_t *h = maps[j].h;
			h->maps--;
			maps[j] = maps[--nmaps];
			stats[ST_MAPPINGS]--;
			handle_maybe_free(h);
			continue;
		}
		j++;
	}
	RET(OK);
}
static CUresult fMemSetAccess(u64 p, size_t size, const access_t *d, size_t n) {
	LOCK();
	NEED_CTX();
	if (!d || n == 0 || size == 0) RET(E_INVALID_VALUE);
	/* The whole range must be mapped. */
	for (u64 at = p; at < p + size;) {
		mapping_t *m = find_map(at);
		if (!m) RET(E_INVALID_VALUE);
		at = m->base + m->size;
	}
	for (size_t i = 0; i < n; i++) {
		if (d[i].flags < 0 || d[i].flags > 3 || d[i].flags == 2) RET(E_INVALID_VALUE);
		if (d[i].loc.type == 1 && bad_dev(d[i].loc.id)) RET(E_INVALID_DEVICE);
		if (d[i].loc.type != 1 && d[i].loc.type != 2 && d[i].loc.type != 3) RET(E_INVALID_VALUE);
	}
	for (u64 at = p; at < p + size;) {
		mapping_t *m = find_map(at);
		for (size_t i = 0; i < n; i++) m->access[d[i].loc.type == 1 ? d[i].loc.id : MAXDEV] = d[i].flags;
		int acc = 0;
		for (int k = 0; k <= MAXDEV; k++) acc |= m->access[k];
		mprotect((void *)m->base, m->size, acc == 3 ? PROT_READ | PROT_WRITE : acc ? PROT_READ : PROT_NONE);
		at = m->base + m->size;
	}
	RET(OK);
}
static CUresult fMemGetAccess(u64 *flags, const loc_t *loc, u64 p) {
	LOCK();
	NEED_CTX();
	mapping_t *m = find_map(p);
	if (!flags || !loc || !m) RET(E_INVALID_VALUE);
	if (loc->type == 1 && bad_dev(loc->id)) RET(E_INVALID_DEVICE);
	*flags = (u64)m->access[loc->type == 1 ? loc->id : MAXDEV];
	RET(OK);
}
/* VMM POSIX-fd export (in one process, as pool IPC): the exported fd is an
   eventfd whose counter is the handle's export id (an anonymous inode, as
   the real driver's export is not a regular file, pipe or socket, which
   importers refuse); an import maps the same physical memory (the
   exporter's memfd) while the exporting handle is live, and reports the
   exporter's properties, as cuMemGetAllocationPropertiesFromHandle does. */
static u64 vmm_export_serial;
static CUresult fMemExportToShareableHandle(void *out, u64 hv, int type, u64 flags) {
	LOCK();
	NEED_CTX();
	if (type == 8) RET(fabric_mem_export(out, hv, flags));
	handle_t *h = as_handle(hv);
	if (!out || !h || type != 1 || flags || !(((alloc_prop_t *)h->prop)->handle_types & 1)) RET(E_INVALID_VALUE);
	if (!h->export_id) h->export_id = ++vmm_export_serial;
	int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (fd < 0) RET(E_OUT_OF_MEMORY);
	if (write(fd, &h->export_id, sizeof h->export_id) != sizeof h->export_id) { close(fd); RET(E_OUT_OF_MEMORY); }
	*(int *)out = fd;
	RET(OK);
}
static CUresult fMemImportFromShareableHandle(u64 *out, void *osh, int type) {
	LOCK();
	NEED_CTX();
	if (type == 8) RET(fabric_mem_import(out, osh));
	int fd = (int)(intptr_t)osh;
	if (!out || type != 1 || nhandles == MAXH) RET(E_INVALID_VALUE);
	long long id = pool_fd_id(fd); /* any eventfd's counter, read back as pools' are */
	handle_t *src = 0;
	for (int i = 0; id > 0 && i < nhandles; i++)
		if (handles[i]->export_id == (u64)id) src = handles[i];
	if (!src) RET(E_INVALID_VALUE);
	int nfd = fcntl(src->fd, F_DUPFD_CLOEXEC, 3);
	if (nfd < 0) RET(E_OUT_OF_MEMORY);
	handle_t *h = calloc(1, sizeof *h);
	if (!h) { close(nfd); RET(E_OUT_OF_MEMORY); }
	h->fd = nfd, h->size = src->size, h->refs = 1, h->imported = 1, h->dev = current->dev;
	memcpy(h->prop, src->prop, sizeof h->prop);
	handles[nhandles++] = h;
	stats[ST_VMM_HANDLES]++;
	*out = (u64)h;
	RET(OK);
}
static CUresult fMemRetainAllocationHandle(u64 *out, void *addr) {
	LOCK();
	NEED_CTX();
	mapping_t *m = find_map((u64)addr);
	if (!out || !m) RET(E_INVALID_VALUE);
	m->h->refs++;
	*out = (u64)m->h;
	RET(OK);
}
static CUresult fMemGetAllocationPropertiesFromHandle(alloc_prop_t *prop, u64 hv) {
	LOCK();
	NEED_CTX();
	handle_t *h = as_handle(hv);
	if (!prop || !h) RET(E_INVALID_VALUE);
	memcpy(prop, h->prop, sizeof *prop);
	RET(OK);
}

/* ---- legacy IPC (in one process: the opened pointer is a second mapping) ---- */
typedef struct { u64 magic, ptr, size; unsigned char pad[40]; } ipc_handle_t;
static CUresult fIpcGetMemHandle(ipc_handle_t *h, u64 p) {
	LOCK();
	NEED_CTX();
	alloc_t *a = find_base(p);
	if (!h || !a || a->kind != K_DEVICE) RET(E_INVALID_VALUE);
	memset(h, 0, sizeof *h);
	h->magic = EXPORT_MAGIC, h->ptr = p, h->size = a->size;
	RET(OK);
}
static CUresult fIpcOpenMemHandle(u64 *out, ipc_handle_t h, unsigned flags) {
	LOCK();
	NEED_CTX();
	alloc_t *a = find_base(h.ptr);
	if (!out || h.magic != EXPORT_MAGIC || !a || a->kind != K_DEVICE || a->size != h.size || flags > 1) RET(E_INVALID_VALUE);
	if (nallocs == capallocs) {
		int c = capallocs * 2;
		alloc_t *na = realloc(allocs, c * sizeof *na);
		if (!na) RET(E_OUT_OF_MEMORY);
		allocs = na, capallocs = c;
		a = find_base(h.ptr);
	}
	void *m = mremap((void *)a->base, 0, a->maplen, MREMAP_MAYMOVE);
	if (m == MAP_FAILED) RET(E_OUT_OF_MEMORY);
	allocs[nallocs++] = (alloc_t){(u64)m, a->size, a->maplen, K_IMPORT, a->dev, 0};
	stats[ST_ALLOCS]++;
	*out = (u64)m;
	RET(OK);
}
static CUresult fIpcCloseMemHandle(u64 p) {
	LOCK();
	NEED_CTX();
	alloc_t *a = find_base(p);
	if (!a || a->kind != K_IMPORT || a->pool) RET(E_INVALID_VALUE);
	drop_alloc(a);
	RET(OK);
}

/* An interprocess event handle the fake opens: the magic, then bytes that
   must arrive as the test wrote them (the handle travels by value), the
   last one 0x5a. The opened event is a completed one. */
#define IPC_EVENT_MAGIC 0x746e657663706966ull /* "fipcvent" */
typedef struct { u64 magic; unsigned char pad[55]; unsigned char tail; } ipc_event_handle_t;
static CUresult fIpcOpenEventHandle(void **e, ipc_event_handle_t h) {
	LOCK();
	NEED_CTX();
	if (!e || h.magic != IPC_EVENT_MAGIC || h.tail != 0x5a || nevents == MAXS) RET(E_INVALID_VALUE);
	for (int i = 0; i < (int)sizeof h.pad; i++)
		if (h.pad[i] != (unsigned char)i) RET(E_INVALID_VALUE);
	event_t *ev = calloc(1, sizeof *ev);
	if (!ev) RET(E_OUT_OF_MEMORY);
	ev->dev = current->dev;
	ev->ctx = current;
	ev->recorded = 1;
	events[nevents++] = ev;
	stats[ST_EVENTS]++;
	*e = ev;
	RET(OK);
}

static CUresult fGetErrorName(int r, const char **s) {
	if (!s) return E_INVALID_VALUE;
	*s = "CUDA_ERROR_FAKE";
	return OK;
}

/* ---- process checkpoints (cuCheckpointProcess*) ---- */
/* A state machine per process id, as the driver documents it: running
   -Lock-> locked -Checkpoint-> checkpointed -Restore-> locked -Unlock->
   running; a call in another state returns CUDA_ERROR_ILLEGAL_STATE and
   changes nothing. Any live process starts running. Nothing is locked or
   copied for real: the state is this fake's (per process using it). A
   restore's GPU pairs, when given, must map every device by UUID, each
   onto a distinct device. Reserved argument fields must be zero. */
#define CKPT_MAX 64
typedef struct { int pid, state; } ckpt_t;
static ckpt_t ckpt[CKPT_MAX];
static int nckpt;
enum { PS_RUNNING, PS_LOCKED, PS_CHECKPOINTED, PS_FAILED };

static int zeroed(const void *p, size_t n) {
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++)
		if (b[i]) return 0;
	return 1;
}
/* ckpt_state returns the state slot of pid (a new one, running, for a
   live process seen first), or 0 for a pid no process has. Called with mu
   held. */
static int *ckpt_state(int pid) {
	if (pid <= 0 || (kill(pid, 0) != 0 && errno != EPERM)) return 0;
	for (int i = 0; i < nckpt; i++)
		if (ckpt[i].pid == pid) return &ckpt[i].state;
	if (nckpt == CKPT_MAX) return 0;
	ckpt[nckpt] = (ckpt_t){.pid = pid, .state = PS_RUNNING};
	return &ckpt[nckpt++].state;
}
/* ckpt_move moves pid from state from to state to. */
static CUresult ckpt_move(int pid, int from, int to) {
	if (!initialized) return E_NOT_INITIALIZED;
	LOCK();
	int *st = ckpt_state(pid);
	if (!st) RET(E_INVALID_VALUE);
	if (*st != from) RET(E_ILLEGAL_STATE);
	*st = to;
	RET(OK);
}
typedef struct { unsigned timeoutMs, reserved0; u64 reserved1[7]; } ckpt_lock_args;
typedef struct { u64 reserved[8]; } ckpt_plain_args;
typedef struct { unsigned char old_uuid[16], new_uuid[16]; } ckpt_pair;
typedef struct { ckpt_pair *pairs; unsigned count; char reserved[52 - sizeof(ckpt_pair *)]; u64 reserved1; } ckpt_restore_args;

static CUresult fCheckpointProcessLock(int pid, ckpt_lock_args *a) {
	if (a && (a->reserved0 || !zeroed(a->reserved1, sizeof a->reserved1))) return E_INVALID_VALUE;
	return ckpt_move(pid, PS_RUNNING, PS_LOCKED);
}
static CUresult fCheckpointProcessCheckpoint(int pid, ckpt_plain_args *a) {
	if (a && !zeroed(a, sizeof *a)) return E_INVALID_VALUE;
	return ckpt_move(pid, PS_LOCKED, PS_CHECKPOINTED);
}
static int uuid_dev(const unsigned char *u) {
	for (int d = 0; d < ndev; d++) {
		unsigned char want[16];
		fDeviceGetUuid(want, d);
		if (!memcmp(u, want, 16)) return d;
	}
	return -1;
}
static CUresult fCheckpointProcessRestore(int pid, ckpt_restore_args *a) {
	if (a) {
		if (!zeroed(a->reserved, sizeof a->reserved) || a->reserved1) return E_INVALID_VALUE;
		if (a->count && !a->pairs) return E_INVALID_VALUE;
		if (a->count) {
			int from[MAXDEV] = {0}, onto[MAXDEV] = {0};
			if (a->count != (unsigned)ndev) return E_INVALID_VALUE; /* every GPU, or none */
			for (unsigned i = 0; i < a->count; i++) {
				int o = uuid_dev(a->pairs[i].old_uuid), n = uuid_dev(a->pairs[i].new_uuid);
				if (o < 0 || n < 0 || from[o]++ || onto[n]++) return E_INVALID_VALUE;
			}
		}
	}
	return ckpt_move(pid, PS_CHECKPOINTED, PS_LOCKED);
}
static CUresult fCheckpointProcessUnlock(int pid, ckpt_plain_args *a) {
	if (a && !zeroed(a, sizeof *a)) return E_INVALID_VALUE;
	return ckpt_move(pid, PS_LOCKED, PS_RUNNING);
}
static CUresult fCheckpointProcessGetState(int pid, int *state) {
	if (!initialized) return E_NOT_INITIALIZED;
	if (!state) return E_INVALID_VALUE;
	LOCK();
	int *st = ckpt_state(pid);
	if (!st) RET(E_INVALID_VALUE);
	*state = *st;
	RET(OK);
}
/* The restore thread: the process's main thread stands for it. */
static CUresult fCheckpointProcessGetRestoreThreadId(int pid, int *tid) {
	if (!initialized) return E_NOT_INITIALIZED;
	if (!tid) return E_INVALID_VALUE;
	LOCK();
	if (!ckpt_state(pid)) RET(E_INVALID_VALUE);
	*tid = pid;
	RET(OK);
}
static void *ckpt_proc(const char *sym) {
	static const struct { const char *name; void *fn; } t[] = {
		{"cuCheckpointProcessLock", (void *)fCheckpointProcessLock},
		{"cuCheckpointProcessCheckpoint", (void *)fCheckpointProcessCheckpoint},
		{"cuCheckpointProcessRestore", (void *)fCheckpointProcessRestore},
		{"cuCheckpointProcessUnlock", (void *)fCheckpointProcessUnlock},
		{"cuCheckpointProcessGetState", (void *)fCheckpointProcessGetState},
		{"cuCheckpointProcessGetRestoreThreadId", (void *)fCheckpointProcessGetRestoreThreadId},
	};
	for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
		if (!strcmp(sym, t[i].name)) return t[i].fn;
	return 0;
}

/* ---- cuGetProcAddress ---- */
/* Contexts made elsewhere (cuCtxCreate, green contexts). */
/* cuCtxCreate pushes the new context on the calling thread's stack; the
   thread's current context is the top (cuCtxSetCurrent replaces it). */
#define CTX_STACK 16
static __thread ctx_t *ctx_stack[CTX_STACK];
static __thread int ctx_depth;

static void ctx_pop(void) { current = ctx_depth ? ctx_stack[--ctx_depth] : 0; }

static CUresult ctx_create(void **pctx, unsigned flags, int d) {
	if (!initialized) return E_NOT_INITIALIZED;
	if (!pctx) return E_INVALID_VALUE;
	if (bad_dev(d)) return E_INVALID_DEVICE;
	unsigned sched = flags & 7;
	if ((flags & ~0xFFu) || (sched & (sched - 1))) return E_INVALID_VALUE;
	LOCK();
	if (ctx_depth == CTX_STACK) RET(E_INVALID_VALUE);
	ctx_t *c = new_made();
	if (!c) RET(E_OUT_OF_MEMORY);
	*c = (ctx_t){.magic = CTX_MAGIC, .dev = d, .retains = 1, .made = 1};
	stats[ST_CONTEXTS]++;
	ctx_stack[ctx_depth++] = current;
	current = c;
	*pctx = c;
	RET(OK);
}
static CUresult fCtxCreate_v2(void **pctx, unsigned flags, int d) { return ctx_create(pctx, flags, d); }
/* v4: only NULL params (no execution affinity, no CIG) are emulated. */
static CUresult fCtxCreate_v4(void **pctx, void *params, unsigned flags, int d) {
	if (params) return E_NOT_SUPPORTED;
	return ctx_create(pctx, flags, d);
}
/* cuCtxDestroy: like CUDA, the context's streams and events die with it;
   it is popped if current on the calling thread. Primary contexts cannot
   be destroyed. */
/* Streams freed with their context (cuCtxDestroy), the latest MAXDEADS:
   a real driver may crash on one handed back to it (see crash). */
#define MAXDEADS 1024
static void *dead_streams[MAXDEADS];
static int ndead_streams;
static int dead_stream(void *s) {
	int n = ndead_streams < MAXDEADS ? ndead_streams : MAXDEADS;
	for (int i = 0; i < n; i++)
		if (dead_streams[i] == s) return 1;
	return 0;
}
static CUresult fCtxDestroy(void *p) {
	if (!initialized) return E_NOT_INITIALIZED;
	LOCK();
	ctx_t *c = as_made(p);
	if (!c && dead_made(p)) crash();
	if (!c) RET(E_INVALID_CONTEXT);
	c->dead = 1;
	c->retains = 0;
	stats[ST_CONTEXTS]--;
	for (int i = 0; i < nstreams;)
		if (streams[i]->ctx == c) {
			dead_streams[ndead_streams++ % MAXDEADS] = streams[i];
			free(streams[i]);
			streams[i] = streams[--nstreams];
			stats[ST_STREAMS]--;
		} else i++;
	for (int i = 0; i < nevents;)
		if (events[i]->ctx == c) {
			free(events[i]);
			events[i] = events[--nevents];
			stats[ST_EVENTS]--;
		} else i++;
	if (current == c) ctx_pop();
	RET(OK);
}
static CUresult fCtxPopCurrent(void **pctx) {
	if (!initialized) return E_NOT_INITIALIZED;
	if (!current) return E_INVALID_CONTEXT;
	if (pctx) *pctx = current;
	ctx_pop();
	return OK;
}
static CUresult stream_ctx(void *s, void **pctx) {
	if (!initialized) return E_NOT_INITIALIZED;
	if (!pctx) return E_INVALID_VALUE;
	LOCK();
	if (s == 0 || s == (void *)1 || s == (void *)2) {
		if (!current || current->dead) RET(E_INVALID_CONTEXT);
		*pctx = current;
		RET(OK);
	}
	for (int i = 0; i < nstreams; i++)
		if (streams[i] == s) {
			if (streams[i]->ctx->dead) RET(E_INVALID_CONTEXT);
			/* A green context's stream reports the device's primary
			   context (and, through _v2, the green context). */
			*pctx = streams[i]->green ? (void *)&ctxs[streams[i]->dev] : (void *)streams[i]->ctx;
			RET(OK);
		}
	if (dead_stream(s)) crash();
	RET(E_INVALID_HANDLE);
}
static void *stream_green(void *s) {
	LOCK();
	void *g = s == 0 || s == (void *)1 || s == (void *)2 ? (current ? current->green : 0) : 0;
	for (int i = 0; i < nstreams; i++)
		if (streams[i] == s) g = streams[i]->green;
	UNLOCK();
	return g;
}
static CUresult fStreamGetCtx(void *s, void **pctx) { return stream_ctx(s, pctx); }
/* cuCtxGetId: unique for the life of the process, never reused. */
static CUresult fCtxGetId(void *p, u64 *id) {
	if (!initialized) return E_NOT_INITIALIZED;
	if (!id) return E_INVALID_VALUE;
	LOCK();
	ctx_t *c = p ? as_ctx(p) : current;
	if (p && !c && dead_made(p)) crash();
	if (!c || c->dead) RET(E_INVALID_CONTEXT);
	*id = c->made ? 1000 + (u64)(c - made_ctxs) : 1 + (u64)c->dev;
	RET(OK);
}
static CUresult fStreamGetCtx_v2(void *s, void **pctx, void **pgreen) {
	if (!pgreen) return E_INVALID_VALUE;
	*pgreen = 0;
	CUresult r = stream_ctx(s, pctx);
	if (r == OK) *pgreen = stream_green(s);
	return r;
}

/* Green contexts. CUdevResource: type, 92 bytes the driver keeps (the
   fake puts a mark and the device there), the SM union member. */
typedef struct {
	unsigned type;
	unsigned char pad[92];
	unsigned sm_count, min_part, align;
	unsigned char rest[36];
} devres_t;
#define RES_MARK 0x52534b46u
static int res_ok(const devres_t *r) {
	unsigned mark;
	memcpy(&mark, r->pad, 4);
	return r->type == 1 && mark == RES_MARK && !bad_dev(r->pad[4]);
}
static void res_fill(devres_t *r, int dev, unsigned n) {
	memset(r, 0, sizeof *r);
	r->type = 1;
	unsigned mark = RES_MARK;
	memcpy(r->pad, &mark, 4);
	r->pad[4] = (unsigned char)dev;
	r->sm_count = n, r->min_part = 8, r->align = 2;
}
static CUresult fDeviceGetDevResource(int d, devres_t *r, int type) {
	if (bad_dev(d)) return E_INVALID_DEVICE;
	if (!r || type != 1) return E_INVALID_VALUE;
	res_fill(r, d, 132);
	return OK;
}
static CUresult fDevSmResourceSplitByCount(devres_t *result, unsigned *nb, const devres_t *in, devres_t *rem, unsigned flags, unsigned min) {
	if (!nb || !in || !res_ok(in) || flags > 3 || min > in->sm_count) return E_INVALID_VALUE;
	unsigned g = min < 8 ? 8 : min;
	g = (g + 1) / 2 * 2;
	unsigned groups = g > in->sm_count ? 0 : in->sm_count / g;
	if (!result) { *nb = groups; return OK; }
	unsigned n = *nb < groups ? *nb : groups;
	for (unsigned i = 0; i < n; i++) res_fill(&result[i], in->pad[4], g);
	if (rem) res_fill(rem, in->pad[4], in->sm_count - n * g);
	*nb = n;
	return OK;
}
#define MAXDESC 1024
typedef struct { int magic; int dev; unsigned sms; } desc_t;
static desc_t descs[MAXDESC];
static int ndescs;
static CUresult fDevResourceGenerateDesc(void **pd, devres_t *res, unsigned nb) {
	if (!pd || !res || nb == 0) return E_INVALID_VALUE;
	unsigned sms = 0;
	for (unsigned i = 0; i < nb; i++) {
		if (!res_ok(&res[i]) || res[i].pad[4] != res[0].pad[4]) return E_INVALID_VALUE;
		sms += res[i].sm_count;
	}
	LOCK();
	if (ndescs == MAXDESC) RET(E_OUT_OF_MEMORY);
	descs[ndescs] = (desc_t){CTX_MAGIC, res[0].pad[4], sms};
	*pd = &descs[ndescs++];
	RET(OK);
}
typedef struct { int magic; ctx_t *ctx; int dead; } green_t;
static green_t greens[MAXC];
static int ngreens;
static green_t *as_green(void *p) {
	for (int i = 0; i < ngreens; i++)
		if (p == (void *)&greens[i] && !greens[i].dead) return &greens[i];
	return 0;
}
/* live_green is as_green, counting a destroyed green context's handle as
   a crash (see crash). */
static green_t *live_green(void *p) {
	green_t *g = as_green(p);
	for (int i = 0; !g && i < ngreens; i++)
		if (p == (void *)&greens[i]) crash();
	return g;
}
static CUresult fGreenCtxCreate(void **pg, void *desc, int d, unsigned flags) {
	if (!initialized) return E_NOT_INITIALIZED;
	if (!pg || flags != 1) return E_INVALID_VALUE;
	if (bad_dev(d)) return E_INVALID_DEVICE;
	LOCK();
	desc_t *ds = 0;
	for (int i = 0; i < ndescs; i++)
		if (desc == (void *)&descs[i]) ds = &descs[i];
	if (!ds) RET(E_INVALID_VALUE);
	if (ds->dev != d) RET(E_INVALID_DEVICE);
	green_t *g = 0;
	for (int i = 0; reuse_ctx && !g && i < ngreens; i++)
		if (greens[i].dead) g = &greens[i];
	if (!g && ngreens == MAXC) RET(E_OUT_OF_MEMORY);
	ctx_t *c = new_made();
	if (!c) RET(E_OUT_OF_MEMORY);
	if (!g) g = &greens[ngreens++];
	*c = (ctx_t){.magic = CTX_MAGIC, .dev = d, .retains = 1, .made = 1, .green = g};
	*g = (green_t){CTX_MAGIC, c, 0};
	stats[ST_CONTEXTS]++;
	*pg = g;
	RET(OK);
}
static CUresult fCtxFromGreenCtx(void **pc, void *pg) {
	if (!pc) return E_INVALID_VALUE;
	LOCK();
	green_t *g = live_green(pg);
	if (!g) RET(E_INVALID_HANDLE);
	*pc = g->ctx;
	RET(OK);
}
/* cuGreenCtxDestroy: unlike cuCtxDestroy, its streams are not destroyed:
   they go dead and stay counted (CUDA leaks them). */
static CUresult fGreenCtxDestroy(void *pg) {
	LOCK();
	green_t *g = live_green(pg);
	if (!g) RET(E_INVALID_HANDLE);
	g->dead = 1;
	g->ctx->dead = 1;
	g->ctx->retains = 0;
	stats[ST_CONTEXTS]--;
	if (current == g->ctx) current = 0;
	RET(OK);
}
static CUresult fGreenCtxStreamCreate(void **ps, void *pg, unsigned flags, int prio) {
	if (!ps || flags != 1) return E_INVALID_VALUE;
	LOCK();
	green_t *g = live_green(pg);
	if (!g) RET(E_INVALID_HANDLE);
	if (nstreams == MAXS) RET(E_INVALID_VALUE);
	stream_t *st = malloc(sizeof *st);
	if (!st) RET(E_OUT_OF_MEMORY);
	*st = (stream_t){g->ctx->dev, (int)flags, g->ctx, g};
	streams[nstreams++] = st;
	stats[ST_STREAMS]++;
	*ps = st;
	RET(OK);
}
/* ctx_proc resolves the entry points whose ABI depends on the version
   asked for: "cuCtxCreate" is _v2 before CUDA 13.0 and _v4 from there (the
   13.0 header's mapping); "cuStreamGetCtx" is _v2 from 12.5. As the real
   driver, names with a _vN suffix resolve to nothing. */
static void *ctx_proc(const char *sym, int ver) {
	if (!strcmp(sym, "cuCtxCreate")) return ver >= 13000 ? (void *)fCtxCreate_v4 : (void *)fCtxCreate_v2;
	if (!strcmp(sym, "cuStreamGetCtx") && ver >= 12050) return (void *)fStreamGetCtx_v2;
	return 0;
}

/* Stream capture and graphs.

   A capture records, per stream, a graph: allocation nodes (their
   addresses are mapped at capture time, so later nodes can be checked
   against them, but count as graph memory only while a launch holds
   them), free nodes, data nodes (copies, fills and kernel launches, each
   checked at capture and kept with its operands), and a count of the
   other nodes. A launch runs on the launching stream, in its order (every
   call of the fake completes before it returns): it allocates each
   allocation node (it fails if the memory from the previous launch is
   still allocated, unless the exec was instantiated with
   auto-free-on-launch), runs the data nodes in the order they were
   captured, as a real launch moves the data, and frees each free node's
   address. Every data node is checked again before the launch changes
   anything (its memory may have been freed since the capture): a launch
   that would touch memory no longer there fails whole. cuMemFreeAsync
   outside a capture frees a launch's allocation. Graph memory is reserved
   at first use and given back by cuDeviceGraphMemTrim when no launch
   holds it. */
#define MAXG 1024
#define MAXGN 64
typedef struct graph {
	int dev, live;
	int nalloc, nfree, nodes, execs;
	u64 alloc[MAXGN];
	u64 freep[MAXGN];
	gop_t *ops; /* data nodes, in capture order */
	int nops, capops;
} graph_t;
static CUresult graph_add_op(void *s, const gop_t *op) {
	graph_t *g = ((stream_t *)s)->cg;
	if (g->nops == g->capops) {
		int c = g->capops ? g->capops * 2 : 16;
		gop_t *n = realloc(g->ops, c * sizeof *n);
		if (!n) return E_OUT_OF_MEMORY;
		g->ops = n, g->capops = c;
	}
	g->ops[g->nops++] = *op;
	return OK;
}

static graph_t *graphs[MAXG];
static int ngraphs;
typedef struct exec {
	int dev;
	graph_t *g;   /* the graph's nodes, copied at instantiation */
	graph_t *src; /* the graph instantiated, until destroyed */
	u64 flags;
} exec_t;
static exec_t *execs[MAXG];
static int nexecs;
typedef struct gmem {
	u64 ptr, size;
	int dev, refs; /* graphs and execs holding the node */
	int live, backed;
} gmem_t;
#define MAXGM 4096
static gmem_t gmems[MAXGM];
static int ngmems;
static u64 gm_used[MAXDEV], gm_used_high[MAXDEV], gm_resv[MAXDEV], gm_resv_high[MAXDEV];
static u64 next_capid = 1;

static stream_t *as_stream(void *s) {
	for (int i = 0; i < nstreams; i++)
		if (streams[i] == s) return streams[i];
	return 0;
}
static graph_t *as_graph(void *g) {
	for (int i = 0; i < ngraphs; i++)
		if (graphs[i] == g) return graphs[i];
	return 0;
}
static exec_t *as_exec(void *e) {
	for (int i = 0; i < nexecs; i++)
		if (execs[i] == e) return execs[i];
	return 0;
}
static gmem_t *as_gmem(u64 p) {
	for (int i = 0; i < ngmems; i++)
		if (gmems[i].ptr == p) return &gmems[i];
	return 0;
}
static void gm_stat(int dev) {
	if (gm_used[dev] > gm_used_high[dev]) gm_used_high[dev] = gm_used[dev];
	if (gm_resv[dev] > gm_resv_high[dev]) gm_resv_high[dev] = gm_resv[dev];
}
/* gm_drop forgets a node's memory once nothing holds it. */
static void gm_maybe_drop(gmem_t *m) {
	if (m->refs > 0 || m->live) return;
	if (m->backed) { gm_resv[m->dev] -= m->size; stats[ST_GRAPH_RESERVED] -= m->size; }
	alloc_t *a = find_base(m->ptr);
	if (a) drop_alloc(a);
	*m = gmems[--ngmems];
}
static void graph_release(graph_t *g) {
	for (int i = 0; i < g->nalloc; i++) {
		gmem_t *m = as_gmem(g->alloc[i]);
		if (m) { m->refs--; gm_maybe_drop(m); }
	}
}
static void graph_hold(graph_t *g) {
	for (int i = 0; i < g->nalloc; i++) {
		gmem_t *m = as_gmem(g->alloc[i]);
		if (m) m->refs++;
	}
}
static void graph_free(graph_t *g) {
	graph_release(g);
	for (int i = 0; i < ngraphs; i++)
		if (graphs[i] == g) { graphs[i] = graphs[--ngraphs]; break; }
	free(g->ops);
	free(g);
	stats[ST_GRAPHS]--;
}
/* invalidate marks the whole capture st is in invalidated: the stream
   that began it and every stream that joined it. */
static void invalidate(stream_t *st) {
	if (!st || st->cap != 1) return;
	void *g = st->cg;
	for (int i = 0; i < nstreams; i++) {
		stream_t *x = streams[i];
		if (x->cap != 1 || x->cg != g) continue;
		x->cap = 2;
		if (x->mode == 0 && x->origin == x) global_captures--;
	}
}
static void invalidate_ctx(ctx_t *c) {
	for (int i = 0; i < nstreams; i++)
		if (streams[i]->cap == 1 && streams[i]->ctx == c) invalidate(streams[i]);
}
static void graph_node(void *g) { ((graph_t *)g)->nodes++; }
/* capture_live reports whether graph g is still being captured. */
static int capture_live(void *g) {
	for (int i = 0; i < nstreams; i++)
		if (streams[i]->cap && streams[i]->cg == g) return 1;
	return 0;
}
static void invalidate_global(void) {
	for (int i = 0; i < nstreams; i++)
		if (streams[i]->cap == 1 && streams[i]->mode == 0) invalidate(streams[i]);
}
/* The legacy stream waiting (on anything) while a blocking stream of its
   device captures joins, and so invalidates, that capture. */
/* The legacy stream used while a blocking stream of its device captures
   joins (and so invalidates) that capture. */
static CUresult legacy_guard(void *s) {
	if (s != 0 && s != (void *)1) return OK;
	int hit = 0;
	for (int i = 0; i < nstreams; i++)
		if (streams[i]->cap == 1 && !(streams[i]->flags & 1) && streams[i]->dev == current->dev) {
			invalidate(streams[i]);
			hit = 1;
		}
	return hit ? E_CAPTURE_IMPLICIT : OK;
}
static CUresult capture_op(void *s, int *captured) {
	*captured = 0;
	stream_t *st = as_stream(s);
	if (!st) return legacy_guard(s);
	if (st->cap == 2) return E_CAPTURE_INVALIDATED;
	if (st->cap == 1) { ((graph_t *)st->cg)->nodes++; *captured = 1; }
	return OK;
}
static CUresult capture_sync(void *s) {
	stream_t *st = as_stream(s);
	if (!st) return legacy_guard(s);
	if (st->cap == 1) { invalidate(st); return E_CAPTURE_UNSUPPORTED; }
	if (st->cap == 2) return E_CAPTURE_INVALIDATED;
	return OK;
}
static CUresult capture_alloc(u64 *out, size_t n, void *s, int *captured) {
	int c;
	CUresult r = capture_op(s, &c);
	*captured = c;
	if (r || !c) return r;
	graph_t *g = ((stream_t *)s)->cg;
	if (n == 0 || g->nalloc == MAXGN || ngmems == MAXGM) return E_INVALID_VALUE;
	u64 p;
	if ((r = new_alloc(&p, n, K_GRAPH, g->dev, 0))) return r;
	gmems[ngmems++] = (gmem_t){p, n, g->dev, 1, 0, 0};
	g->alloc[g->nalloc++] = p;
	*out = p;
	return OK;
}
static CUresult capture_free(u64 ptr, void *s, int *handled) {
	int c;
	*handled = 0;
	CUresult r = capture_op(s, &c);
	if (r) { *handled = 1; return r; }
	gmem_t *m = as_gmem(ptr);
	if (c) {
		/* A free node: only graph memory, and only once per graph. */
		graph_t *g = ((stream_t *)s)->cg;
		*handled = 1;
		if (!m || g->nfree == MAXGN) return E_INVALID_VALUE;
		for (int i = 0; i < g->nfree; i++)
			if (g->freep[i] == ptr) return E_INVALID_VALUE;
		g->freep[g->nfree++] = ptr;
		return OK;
	}
	if (!m) return OK; /* not graph memory: the pool path frees it */
	*handled = 1;
	if (!m->live) return E_INVALID_VALUE; /* not allocated by a launch now */
	m->live = 0;
	gm_used[m->dev] -= m->size;
	stats[ST_GRAPH_USED] -= m->size;
	gm_maybe_drop(m);
	return OK;
}

static CUresult fStreamBeginCapture(void *s, int mode) {
	LOCK();
	NEED_CTX();
	NEED_STREAM(s);
	stream_t *st = as_stream(s);
	if (!st) RET(E_CAPTURE_UNSUPPORTED); /* the legacy stream cannot capture */
	if (mode < 0 || mode > 2) RET(E_INVALID_VALUE);
	if (st->cap) RET(E_ILLEGAL_STATE);
	if (ngraphs == MAXG) RET(E_OUT_OF_MEMORY);
	graph_t *g = calloc(1, sizeof *g);
	if (!g) RET(E_OUT_OF_MEMORY);
	g->dev = st->dev;
	g->live = 1;
	graphs[ngraphs++] = g;
	stats[ST_GRAPHS]++;
	st->cap = 1, st->mode = mode, st->cg = g, st->capid = next_capid++;
	st->origin = st, st->rejoined = 0;
	if (mode == 0) global_captures++;
	RET(OK);
}
static CUresult fStreamEndCapture(void *s, void **out) {
	LOCK();
	NEED_CTX();
	NEED_STREAM(s);
	stream_t *st = as_stream(s);
	if (!out) RET(E_INVALID_VALUE);
	*out = 0;
	if (!st || !st->cap) RET(E_ILLEGAL_STATE);
	graph_t *g = st->cg;
	if (st->origin != st) { invalidate(st); RET(E_CAPTURE_UNMATCHED); } /* end where it began */
	/* Every stream that joined must have been joined back. */
	int unjoined = 0;
	for (int i = 0; i < nstreams; i++)
		if (streams[i] != st && streams[i]->cg == g && streams[i]->cap == 1 && !streams[i]->rejoined) unjoined = 1;
	if (unjoined) invalidate(st);
	int was = st->cap;
	if (was == 1 && st->mode == 0) global_captures--;
	for (int i = 0; i < nstreams; i++)
		if (streams[i]->cg == g) streams[i]->cap = 0, streams[i]->cg = 0, streams[i]->origin = 0;
	if (unjoined) { graph_free(g); RET(E_CAPTURE_UNJOINED); }
	if (was == 2) { graph_free(g); RET(E_CAPTURE_INVALIDATED); }
	*out = g;
	RET(OK);
}
static CUresult fStreamIsCapturing(void *s, int *status) {
	LOCK();
	NEED_CTX();
	NEED_STREAM(s);
	if (!status) RET(E_INVALID_VALUE);
	stream_t *st = as_stream(s);
	if (!st) {
		for (int i = 0; i < nstreams; i++)
			if (streams[i]->cap == 1 && !(streams[i]->flags & 1) && streams[i]->dev == current->dev) RET(E_CAPTURE_IMPLICIT);
		*status = 0;
		RET(OK);
	}
	*status = st->cap;
	RET(OK);
}
static CUresult fStreamGetCaptureInfo(void *s, int *status, u64 *id, void **graph, const void **deps, const void **edges, size_t *ndeps) {
	LOCK();
	NEED_CTX();
	NEED_STREAM(s);
	if (!status) RET(E_INVALID_VALUE);
	stream_t *st = as_stream(s);
	*status = st ? st->cap : 0;
	if (id) *id = st && st->cap ? st->capid : 0;
	if (graph) *graph = st && st->cap ? st->cg : 0;
	if (deps) *deps = 0;
	if (edges) *edges = 0;
	if (ndeps) *ndeps = 0;
	RET(OK);
}
static CUresult fGraphDestroy(void *h) {
	LOCK();
	NEED_CTX();
	graph_t *g = as_graph(h);
	if (!g) RET(E_INVALID_VALUE);
	for (int i = 0; i < nstreams; i++)
		if (streams[i]->cg == g) RET(E_INVALID_VALUE); /* still being captured */
	g->live = 0;
	/* execs keep their own copy of the nodes */
	for (int i = 0; i < nexecs; i++)
		if (execs[i]->src == g) execs[i]->src = 0;
	graph_free(g);
	RET(OK);
}
static CUresult fGraphInstantiateWithFlags(void **out, void *h, u64 flags) {
	LOCK();
	NEED_CTX();
	graph_t *g = as_graph(h);
	if (!out || !g || (flags & ~15ull) || ((flags & 4) && (flags & 1))) RET(E_INVALID_VALUE);
	for (int i = 0; i < nstreams; i++)
		if (streams[i]->cg == g) RET(E_INVALID_VALUE);
	if ((g->nalloc || g->nfree) && g->execs) RET(E_INVALID_VALUE); /* one exec at a time */
	if (nexecs == MAXG) RET(E_OUT_OF_MEMORY);
	exec_t *e = calloc(1, sizeof *e);
	graph_t *copy = malloc(sizeof *copy);
	gop_t *ops = g->nops ? malloc(g->nops * sizeof *ops) : 0;
	if (!e || !copy || (g->nops && !ops)) { free(e); free(copy); free(ops); RET(E_OUT_OF_MEMORY); }
	*copy = *g;
	if (g->nops) memcpy(ops, g->ops, g->nops * sizeof *ops);
	copy->ops = ops, copy->capops = g->nops;
	graph_hold(copy);
	g->execs++;
	e->dev = g->dev, e->g = copy, e->src = g, e->flags = flags;
	execs[nexecs++] = e;
	stats[ST_GRAPH_EXECS]++;
	*out = e;
	RET(OK);
}
static CUresult fGraphExecDestroy(void *h) {
	LOCK();
	NEED_CTX();
	exec_t *e = as_exec(h);
	if (!e) RET(E_INVALID_VALUE);
	/* The source graph, if it lives, may be instantiated again. */
	if (e->src) e->src->execs--;
	graph_release(e->g);
	free(e->g->ops);
	free(e->g);
	for (int i = 0; i < nexecs; i++)
		if (execs[i] == e) { execs[i] = execs[--nexecs]; break; }
	free(e);
	stats[ST_GRAPH_EXECS]--;
	RET(OK);
}
static CUresult fGraphLaunch(void *h, void *s) {
	LOCK();
	NEED_CTX();
	NEED_STREAM(s);
	exec_t *e = as_exec(h);
	if (!e) RET(E_INVALID_VALUE);
	stream_t *st = as_stream(s);
	if (st && st->cap) RET(E_NOT_SUPPORTED); /* child graphs are not emulated */
	if (st && st->dev != e->dev) RET(E_INVALID_VALUE);
	CUresult r = legacy_guard(s);
	if (r) RET(r);
	graph_t *g = e->g;
	/* Check first, so a failed launch changes nothing. */
	for (int i = 0; i < g->nalloc; i++) {
		gmem_t *m = as_gmem(g->alloc[i]);
		if (!m) RET(E_INVALID_VALUE);
		if (m->live && !(e->flags & 1)) RET(E_INVALID_VALUE); /* the last launch's memory is still allocated */
	}
	for (int i = 0; i < g->nops; i++)
		if ((r = op_check(&g->ops[i]))) RET(r);
	for (int i = 0; i < g->nalloc; i++) {
		gmem_t *m = as_gmem(g->alloc[i]);
		if (m->live) { m->live = 0; gm_used[m->dev] -= m->size; stats[ST_GRAPH_USED] -= m->size; }
	}
	for (int i = 0; i < g->nalloc; i++) {
		gmem_t *m = as_gmem(g->alloc[i]);
		if (!m->backed) { m->backed = 1; gm_resv[m->dev] += m->size; stats[ST_GRAPH_RESERVED] += m->size; }
		m->live = 1;
		gm_used[m->dev] += m->size;
		stats[ST_GRAPH_USED] += m->size;
		gm_stat(m->dev);
	}
	for (int i = 0; i < g->nops; i++) op_run(&g->ops[i]);
	for (int i = 0; i < g->nfree; i++) {
		gmem_t *m = as_gmem(g->freep[i]);
		if (!m || !m->live) continue; /* freed twice: a real driver faults; we skip */
		m->live = 0;
		gm_used[m->dev] -= m->size;
		stats[ST_GRAPH_USED] -= m->size;
	}
	RET(OK);
}
static CUresult fDeviceGraphMemTrim(int d) {
	LOCK();
	if (bad_dev(d)) RET(E_INVALID_DEVICE);
	for (int i = 0; i < ngmems; i++) {
		gmem_t *m = &gmems[i];
		if (m->dev == d && m->backed && !m->live) {
			m->backed = 0;
			gm_resv[d] -= m->size;
			stats[ST_GRAPH_RESERVED] -= m->size;
		}
	}
	RET(OK);
}
static CUresult fDeviceGetGraphMemAttribute(int d, int attr, void *v) {
	LOCK();
	if (bad_dev(d)) RET(E_INVALID_DEVICE);
	if (!v) RET(E_INVALID_VALUE);
	u64 *out = v;
	switch (attr) {
	case 0: *out = gm_used[d]; break;
	case 1: *out = gm_used_high[d]; break;
	case 2: *out = gm_resv[d]; break;
	case 3: *out = gm_resv_high[d]; break;
	default: RET(E_INVALID_VALUE);
	}
	RET(OK);
}
static CUresult fDeviceSetGraphMemAttribute(int d, int attr, void *v) {
	LOCK();
	if (bad_dev(d)) RET(E_INVALID_DEVICE);
	if (!v || *(u64 *)v != 0) RET(E_INVALID_VALUE);
	switch (attr) {
	case 1: gm_used_high[d] = gm_used[d]; break;
	case 3: gm_resv_high[d] = gm_resv[d]; break;
	default: RET(E_INVALID_VALUE);
	}
	RET(OK);
}

/* Batched copies. */
/* cuMemcpyBatchAsync at both ABIs: CUDA 12.8's with size_t *failIdx before
   the stream, 13.0's (_v2) without. cuGetProcAddress hands out the one
   the requested version names (batch_proc). Strict: the legacy default
   stream, empty batches, copies of 0 bytes, null or out-of-range operands
   and malformed attributes are errors, and the whole batch is checked
   before any byte moves. */
typedef struct { int order; loc_t src_hint, dst_hint; unsigned flags; } memcpy_attr_t;
static long long batch_calls[2]; /* [0]: 12.8 ABI, [1]: 13.0 ABI; successful calls */
long long fakecuda_batch_calls(int abi) {
	LOCK();
	long long v = abi == 0 || abi == 1 ? batch_calls[abi] : -1;
	UNLOCK();
	return v;
}
static CUresult batch_copy(u64 *dsts, u64 *srcs, size_t *sizes, size_t count, const memcpy_attr_t *attrs,
			   size_t *idxs, size_t na, size_t *fail_idx, void *s, int abi) {
	if (fail_idx) *fail_idx = (size_t)-1;
	LOCK();
	NEED_CTX();
	if (s == 0 || s == (void *)1) RET(E_INVALID_VALUE); /* "must not be legacy NULL stream" */
	NEED_STREAM(s);
	/* Not capturable: refused, and the capture is lost (as on a driver). */
	stream_t *cst = as_stream(s);
	if (cst && cst->cap == 1) { invalidate(cst); RET(E_CAPTURE_UNSUPPORTED); }
	if (!dsts || !srcs || !sizes || !count || !attrs || !idxs || !na || na > count) RET(E_INVALID_VALUE);
	for (size_t k = 0; k < na; k++) {
		if ((k == 0 && idxs[0] != 0) || (k > 0 && idxs[k] <= idxs[k - 1]) || idxs[k] >= count) RET(E_INVALID_VALUE);
		if (attrs[k].order < 1 || attrs[k].order > 3 || attrs[k].flags > 1) RET(E_INVALID_VALUE);
	}
	for (size_t i = 0; i < count; i++) {
		CUresult r = OK;
		if (!sizes[i] || !dsts[i] || !srcs[i]) r = E_INVALID_VALUE;
		if (!r) r = any_range(dsts[i], sizes[i], 1);
		if (!r) r = any_range(srcs[i], sizes[i], 0);
		if (r) {
			if (fail_idx) *fail_idx = i;
			RET(r);
		}
	}
	for (size_t i = 0; i < count; i++) memmove((void *)dsts[i], (void *)srcs[i], sizes[i]);
	batch_calls[abi]++;
	RET(OK);
}
static CUresult fMemcpyBatchAsync_v1(u64 *d, u64 *s, size_t *n, size_t count, const memcpy_attr_t *a, size_t *ai,
				     size_t na, size_t *fail_idx, void *st) {
	return batch_copy(d, s, n, count, a, ai, na, fail_idx, st, 0);
}
static CUresult fMemcpyBatchAsync_v2(u64 *d, u64 *s, size_t *n, size_t count, const memcpy_attr_t *a, size_t *ai,
				     size_t na, void *st) {
	return batch_copy(d, s, n, count, a, ai, na, 0, st, 1);
}
/* batch_proc: the entry point cuGetProcAddress gives for "cuMemcpyBatchAsync"
   at version ver (none before 12.8). */
static void *batch_proc(int ver) {
	if (ver >= 13000) return (void *)fMemcpyBatchAsync_v2;
	if (ver >= 12080) return (void *)fMemcpyBatchAsync_v1;
	return 0;
}

/* Modules and kernels.

   The fake runs no device code, but it knows cudamem's own test kernels
   (internal/testkit/kernels: the pattern write and check, the word add and fill)
   by name and runs them on the host, so that what uses them (cudamem
   selftest, the GPU tests' helpers) works here too. cuModuleLoadData
   takes any PTX text (it must say ".version"); cuModuleGetFunction finds
   the known kernels an image defines, and answers NOT_SUPPORTED for any
   other kernel it defines (its code cannot run here) and NOT_FOUND for a
   name it does not. cuLaunchKernel checks the stream, the shape, the
   parameters and the memory each kernel touches (as a copy does), then
   runs it, or, under capture, records it as a node each launch of the
   graph runs. */
enum { KN_PATTERN_WRITE, KN_PATTERN_CHECK, KN_ADD_U32, KN_FILL_U32, KN_COUNT };
static const char *const kernel_names[KN_COUNT] = {
	"cudamem_pattern_write", "cudamem_pattern_check", "cudamem_add_u32", "cudamem_fill_u32"};
/* Parameter sizes in bytes, in order (see internal/testkit/kernels/README.md). */
static const int kernel_params[KN_COUNT][4] = {{8, 8, 4, 0}, {8, 8, 4, 8}, {8, 8, 4, 0}, {8, 8, 4, 0}};
static const int kernel_nparams[KN_COUNT] = {3, 4, 3, 3};
#define E_INVALID_PTX 218
#define E_NOT_FOUND 500
#define E_INVALID_IMAGE 200
typedef struct module module_t;
typedef struct { module_t *m; int kern; } func_t;
struct module {
	ctx_t *ctx;
	char *img;         /* the PTX text, for the kernels it defines */
	int has[KN_COUNT]; /* the image defines the kernel */
	func_t funcs[KN_COUNT];
};
#define MAXM 1024
static module_t *modules[MAXM];
static int nmodules;
static module_t *as_module(void *h) {
	for (int i = 0; i < nmodules; i++)
		if (modules[i] == h) return modules[i];
	return 0;
}
static func_t *as_func(void *h) {
	for (int i = 0; i < nmodules; i++)
		for (int k = 0; k < KN_COUNT; k++)
			if ((void *)&modules[i]->funcs[k] == h && modules[i]->has[k]) return &modules[i]->funcs[k];
	return 0;
}
/* defines reports whether PTX text img has an entry named name. */
static int defines(const char *img, const char *name) {
	size_t n = strlen(name);
	for (const char *p = strstr(img, ".entry"); p; p = strstr(p + 1, ".entry")) {
		const char *q = p + 6;
		while (*q == ' ' || *q == '\t') q++;
		if (!strncmp(q, name, n) && (q[n] == '(' || q[n] == ' ' || q[n] == '\t' || q[n] == '\n' || q[n] == '\r')) return 1;
	}
	return 0;
}
static CUresult fModuleLoadData(void **out, const void *image) {
	LOCK();
	NEED_CTX();
	if (!out || !image) RET(E_INVALID_VALUE);
	const char *img = image;
	if (!strstr(img, ".version")) RET(E_INVALID_PTX); /* not PTX text (cubins are not emulated) */
	if (nmodules == MAXM) RET(E_OUT_OF_MEMORY);
	module_t *m = calloc(1, sizeof *m);
	char *copy = strdup(img);
	if (!m || !copy) { free(m); free(copy); RET(E_OUT_OF_MEMORY); }
	m->ctx = current, m->img = copy;
	for (int k = 0; k < KN_COUNT; k++) {
		m->has[k] = defines(img, kernel_names[k]);
		m->funcs[k] = (func_t){m, k};
	}
	modules[nmodules++] = m;
	*out = m;
	RET(OK);
}
static CUresult fModuleUnload(void *h) {
	LOCK();
	NEED_CTX();
	for (int i = 0; i < nmodules; i++)
		if (modules[i] == h) {
			free(modules[i]->img);
			free(h);
			modules[i] = modules[--nmodules];
			RET(OK);
		}
	RET(E_INVALID_HANDLE);
}
static CUresult fModuleGetFunction(void **out, void *h, const char *name) {
	LOCK();
	NEED_CTX();
	module_t *m = as_module(h);
	if (!m) RET(E_INVALID_HANDLE);
	if (!out || !name) RET(E_INVALID_VALUE);
	for (int k = 0; k < KN_COUNT; k++)
		if (!strcmp(name, kernel_names[k])) {
			if (!m->has[k]) RET(E_NOT_FOUND);
			*out = &m->funcs[k];
			RET(OK);
		}
	RET(defines(m->img, name) ? E_NOT_SUPPORTED : E_NOT_FOUND); /* a kernel of its own: cannot run here */
}
/* kernel_range checks memory a kernel touches: like a copy's device
   operand, but a miss is an illegal address, as on a GPU. */
static CUresult kernel_range(u64 p, u64 n, int write) {
	if (n == 0) return OK;
	return device_range(p, n, write) ? E_ILLEGAL_ADDRESS : OK;
}
static CUresult kernel_check(int kern, const u64 *a) {
	switch (kern) {
	case KN_PATTERN_WRITE: return kernel_range(a[0], a[1], 1);
	case KN_PATTERN_CHECK: {
		CUresult r = kernel_range(a[0], a[1], 0);
		if (r || a[1] == 0) return r;
		if (a[3] % 4) return E_ILLEGAL_ADDRESS; /* misaligned atomic */
		return kernel_range(a[3], 4, 1);
	}
	default: /* the word kernels */
		if (a[1] > (~0ull) / 4 || (a[1] && a[0] % 4)) return E_ILLEGAL_ADDRESS;
		return kernel_range(a[0], a[1] * 4, 1);
	}
}
static void kernel_run(int kern, const u64 *a) {
	uint32_t seed = (uint32_t)a[2];
	switch (kern) {
	case KN_PATTERN_WRITE:
		for (u64 i = 0; i < a[1]; i++) ((uint8_t *)a[0])[i] = (uint8_t)((uint32_t)i * 31u + seed);
		break;
	case KN_PATTERN_CHECK: {
		uint32_t bad = 0;
		for (u64 i = 0; i < a[1]; i++)
			if (((uint8_t *)a[0])[i] != (uint8_t)((uint32_t)i * 31u + seed)) bad++;
		if (a[1]) *(uint32_t *)a[3] += bad;
		break;
	}
	case KN_ADD_U32:
		for (u64 i = 0; i < a[1]; i++) ((uint32_t *)a[0])[i] += seed;
		break;
	case KN_FILL_U32:
		for (u64 i = 0; i < a[1]; i++) ((uint32_t *)a[0])[i] = seed;
		break;
	}
}
static CUresult fLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
			      unsigned shmem, void *s, void **params, void **extra) {
	LOCK();
	NEED_CTX();
	NEED_STREAM(s);
	func_t *fn = as_func(f);
	if (!fn) RET(E_INVALID_HANDLE);
	if (fn->m->ctx != current) RET(E_INVALID_CONTEXT); /* a kernel runs in its module's context */
	stream_t *st = as_stream(s);
	if (st && st->ctx != current) RET(E_INVALID_HANDLE);
	if (!gx || !gy || !gz || !bx || !by || !bz || (u64)bx * by * bz > 1024 || shmem > 48 * 1024) RET(E_INVALID_VALUE);
	if (extra) RET(E_NOT_SUPPORTED); /* parameters by buffer are not emulated */
	int k = fn->kern;
	if (!params) RET(E_INVALID_VALUE);
	gop_t op = {.kind = GOP_KERNEL, .kern = k};
	for (int i = 0; i < kernel_nparams[k]; i++) {
		if (!params[i]) RET(E_INVALID_VALUE);
		op.args[i] = kernel_params[k][i] == 4 ? *(uint32_t *)params[i] : *(u64 *)params[i];
	}
	int captured = 0;
	CUresult r = capture_op(s, &captured);
	if (r) RET(r);
	if ((r = kernel_check(k, op.args))) RET(r);
	if (captured) RET(graph_add_op(s, &op)); /* a kernel node, run by each launch */
	kernel_run(k, op.args);
	RET(OK);
}

/* Data nodes (see "Stream capture and graphs"): checked as the call that
   made them was, and run the same way. */
static CUresult op_check(const gop_t *op) {
	CUresult r = OK;
	switch (op->kind) {
	case GOP_COPY:
		r = op->dk == 0 ? device_range(op->dst, op->n, 1) : op->dk == 2 ? any_range(op->dst, op->n, 1) : OK;
		if (!r) r = op->sk == 0 ? device_range(op->src, op->n, 0) : op->sk == 2 ? any_range(op->src, op->n, 0) : OK;
		return r;
	case GOP_FILL: return device_range(op->dst, op->n * op->w, 1);
	}
	return kernel_check(op->kern, op->args);
}
static void op_run(const gop_t *op) {
	switch (op->kind) {
	case GOP_COPY: memmove((void *)op->dst, (void *)op->src, op->n); return;
	case GOP_FILL:
		if (op->w == 1) memset((void *)op->dst, (int)(op->v & 0xff), op->n);
		else if (op->w == 2) for (u64 i = 0; i < op->n; i++) ((uint16_t *)op->dst)[i] = (uint16_t)op->v;
		else for (u64 i = 0; i < op->n; i++) ((uint32_t *)op->dst)[i] = (uint32_t)op->v;
		return;
	}
	kernel_run(op->kern, op->args);
}

/* Fabric handles. */
/* Fabric handles work inside one process, as pool IPC does. fabric_mode()
   says how a system without a multi-node NVLink domain looks:
     0: the device reports fabric support (attribute 128 = 1) but IMEX is
        absent: fabric memory, exports and imports fail NOT_PERMITTED (the
        default, as on a single-node Hopper machine); a pool with fabric
        handles is made all the same, at any location type, and
        destroying it is a crash (see fMemPoolDestroy), as with the real
        driver;
     1: IMEX works: export/import round trips;
     2: the device has no fabric support (attribute 0): NOT_SUPPORTED.
   FAKECUDA_FABRIC sets it at first use ("1", "none", else 0);
   fakecuda_set_fabric changes it at run time and returns the old mode.
   An exported handle is 64 bytes naming an entry of a table of exports
   (a serial and a random nonce); import accepts only bytes equal to an
   entry whose object still lives, so garbage and stale handles are
   refused, as the real driver refuses handles it does not know. */
static int fabric_mode_v = -1;
static int fabric_mode(void) {
	if (fabric_mode_v < 0) {
		const char *e = getenv("FAKECUDA_FABRIC");
		fabric_mode_v = e && !strcmp(e, "1") ? 1 : e && !strcmp(e, "none") ? 2 : 0;
	}
	return fabric_mode_v;
}
int fakecuda_set_fabric(int mode) {
	LOCK();
	int old = fabric_mode();
	if (mode >= 0 && mode <= 2) fabric_mode_v = mode;
	UNLOCK();
	return old;
}
static CUresult fabric_gate(void) {
	switch (fabric_mode()) {
	case 1: return OK;
	case 2: return E_NOT_SUPPORTED;
	}
	return E_NOT_PERMITTED;
}
typedef struct { u64 magic, serial, nonce, kind; unsigned char pad[32]; } fabric_t;
#define FABRIC_MAGIC 0x6661627269636675ull
typedef struct { fabric_t bytes; handle_t *h; ino_t ino; long long pool; } fabric_export_t;
#define MAXFAB 4096
static fabric_export_t fabrics[MAXFAB];
static int nfabrics;
static u64 fabric_serial;
static u64 fabric_nonce(void) {
	u64 v = 0;
	int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) { if (read(fd, &v, sizeof v) != sizeof v) v = 0; close(fd); }
	return v ^ (u64)(uintptr_t)&v ^ ((u64)getpid() << 32) ^ ++fabric_serial * 0x9e3779b97f4a7c15ull;
}
static CUresult fabric_add(void *out, u64 kind, handle_t *h, long long pool) {
	if (nfabrics == MAXFAB) return E_OUT_OF_MEMORY;
	fabric_export_t e = {{FABRIC_MAGIC, ++fabric_serial, fabric_nonce(), kind, {0}}, h, 0, pool};
	struct stat st;
	if (h && fstat(h->fd, &st) == 0) e.ino = st.st_ino;
	fabrics[nfabrics++] = e;
	memcpy(out, &e.bytes, sizeof e.bytes);
	return OK;
}
static fabric_export_t *fabric_find(const void *fh, u64 kind) {
	for (int i = 0; i < nfabrics; i++)
		if (!memcmp(&fabrics[i].bytes, fh, sizeof(fabric_t)) && fabrics[i].bytes.kind == kind) return &fabrics[i];
	return 0;
}
/* Called with the lock held. */
static CUresult fabric_mem_export(void *out, u64 hv, u64 flags) {
	handle_t *h = as_handle(hv);
	if (!out || !h || flags || !(((alloc_prop_t *)h->prop)->handle_types & 8)) return E_INVALID_VALUE;
	CUresult g = fabric_gate();
	if (g) return g;
	return fabric_add(out, 1, h, 0);
}
static CUresult fabric_mem_import(u64 *out, const void *fh) {
	if (!out || !fh || nhandles == MAXH) return E_INVALID_VALUE;
	CUresult g = fabric_gate();
	if (g) return g;
	fabric_export_t *e = fabric_find(fh, 1);
	struct stat st;
	if (!e || !as_handle((u64)e->h) || fstat(e->h->fd, &st) != 0 || st.st_ino != e->ino) return E_INVALID_VALUE;
	int nfd = fcntl(e->h->fd, F_DUPFD_CLOEXEC, 3);
	if (nfd < 0) return E_OUT_OF_MEMORY;
	handle_t *h = calloc(1, sizeof *h);
	if (!h) { close(nfd); return E_OUT_OF_MEMORY; }
	h->fd = nfd, h->size = e->h->size, h->refs = 1, h->imported = 1, h->dev = e->h->dev;
	/* The importer sees the exporter's properties (its location and
	   handle types), as cuMemGetAllocationPropertiesFromHandle reports. */
	memcpy(h->prop, e->h->prop, sizeof h->prop);
	handles[nhandles++] = h;
	stats[ST_VMM_HANDLES]++;
	*out = (u64)h;
	return OK;
}
static CUresult fabric_pool_export(void *out, void *ph, u64 flags) {
	pool_t *p = as_pool(ph);
	if (!out || !p || flags || !(p->handle_types & 8)) return E_INVALID_VALUE;
	CUresult g = fabric_gate();
	if (g) return g;
	return fabric_add(out, 2, 0, p->id);
}
static CUresult fabric_pool_import(void **out, const void *fh, u64 flags) {
	if (!out || !fh || flags || npools == MAXPOOLS) return E_INVALID_VALUE;
	CUresult g = fabric_gate();
	if (g) return g;
	fabric_export_t *e = fabric_find(fh, 2);
	if (!e) return E_INVALID_VALUE;
	pool_t *origin = 0;
	for (int i = 0; i < npools; i++)
		if (pools[i]->id == e->pool && !pools[i]->imported && pools[i]->live) origin = pools[i];
	if (!origin) return E_INVALID_VALUE;
	pool_t *p = calloc(1, sizeof *p);
	if (!p) return E_OUT_OF_MEMORY;
	*p = *origin;
	p->imported = 1;
	p->live = 1;
	p->used = p->used_high = p->reserved = p->reserved_high = 0;
	pools[npools++] = p;
	stats[ST_POOLS]++;
	*out = p;
	return OK;
}

static const struct { const char *name; void *fn; } table[] = {
	{"cuGetErrorName", (void *)fGetErrorName},
	{"cuDeviceGet", (void *)fDeviceGet},
	{"cuDeviceGetCount", (void *)fDeviceGetCount},
	{"cuDeviceGetName", (void *)fDeviceGetName},
	{"cuDeviceGetUuid", (void *)fDeviceGetUuid},
	{"cuDeviceTotalMem", (void *)fDeviceTotalMem},
	{"cuDeviceGetAttribute", (void *)fDeviceGetAttribute},
	{"cuDeviceCanAccessPeer", (void *)fDeviceCanAccessPeer},
	{"cuDeviceGetPCIBusId", (void *)fDeviceGetPCIBusId},
	{"cuDeviceGetDefaultMemPool", (void *)fDeviceGetDefaultMemPool},
	{"cuDeviceGetMemPool", (void *)fDeviceGetMemPool},
	{"cuDeviceSetMemPool", (void *)fDeviceSetMemPool},
	{"cuMemGetMemPool", (void *)fMemGetMemPool},
	{"cuDevicePrimaryCtxRetain", (void *)fPrimaryCtxRetain},
	{"cuDevicePrimaryCtxRelease", (void *)fPrimaryCtxRelease},
	{"cuCtxSetCurrent", (void *)fCtxSetCurrent},
	{"cuCtxGetCurrent", (void *)fCtxGetCurrent},
	{"cuCtxGetDevice", (void *)fCtxGetDevice},
	{"cuCtxSynchronize", (void *)fCtxSynchronize},
	{"cuCtxEnablePeerAccess", (void *)fCtxEnablePeerAccess},
	{"cuCtxDisablePeerAccess", (void *)fCtxDisablePeerAccess},
	{"cuCtxGetStreamPriorityRange", (void *)fCtxGetStreamPriorityRange},
	{"cuStreamCreate", (void *)fStreamCreate},
	{"cuStreamCreateWithPriority", (void *)fStreamCreateWithPriority},
	{"cuStreamDestroy", (void *)fStreamDestroy},
	{"cuStreamSynchronize", (void *)fStreamSynchronize},
	{"cuStreamQuery", (void *)fStreamQuery},
	{"cuStreamGetFlags", (void *)fStreamGetFlags},
	{"cuStreamWaitEvent", (void *)fStreamWaitEvent},
	{"cuEventCreate", (void *)fEventCreate},
	{"cuEventDestroy", (void *)fEventDestroy},
	{"cuEventRecord", (void *)fEventRecord},
	{"cuEventSynchronize", (void *)fEventSynchronize},
	{"cuEventQuery", (void *)fEventQuery},
	{"cuEventElapsedTime", (void *)fEventElapsedTime},
	{"cuMemGetInfo", (void *)fMemGetInfo},
	{"cuMemAlloc", (void *)fMemAlloc},
	{"cuMemFree", (void *)fMemFree},
	{"cuMemAllocHost", (void *)fMemAllocHost},
	{"cuMemFreeHost", (void *)fMemFreeHost},
	{"cuMemHostAlloc", (void *)fMemHostAlloc},
	{"cuMemHostGetDevicePointer", (void *)fMemHostGetDevicePointer},
	{"cuMemHostRegister", (void *)fMemHostRegister},
	{"cuMemHostUnregister", (void *)fMemHostUnregister},
	{"cuMemAllocManaged", (void *)fMemAllocManaged},
	{"cuPointerGetAttribute", (void *)fPointerGetAttribute},
	{"cuMemGetAddressRange", (void *)fMemGetAddressRange},
	{"cuMemcpy", (void *)fMemcpy},
	{"cuMemcpyAsync", (void *)fMemcpyAsync},
	{"cuMemcpyPeerAsync", (void *)fMemcpyPeerAsync},
	{"cuMemcpyHtoD", (void *)fMemcpyHtoD},
	{"cuMemcpyDtoH", (void *)fMemcpyDtoH},
	{"cuMemcpyDtoD", (void *)fMemcpyDtoD},
	{"cuMemcpyHtoDAsync", (void *)fMemcpyHtoDAsync},
	{"cuMemcpyDtoHAsync", (void *)fMemcpyDtoHAsync},
	{"cuMemcpyDtoDAsync", (void *)fMemcpyDtoDAsync},
	{"cuMemsetD8", (void *)fMemsetD8},
	{"cuMemsetD32", (void *)fMemsetD32},
	{"cuMemsetD8Async", (void *)fMemsetD8Async},
	{"cuMemsetD16Async", (void *)fMemsetD16Async},
	{"cuMemsetD32Async", (void *)fMemsetD32Async},
	{"cuMemPrefetchAsync", (void *)fMemPrefetchAsync},
	{"cuMemAdvise", (void *)fMemAdvise},
	{"cuMemRangeGetAttribute", (void *)fMemRangeGetAttribute},
	{"cuMemPrefetchBatchAsync", (void *)fMemPrefetchBatchAsync},
	{"cuMemDiscardBatchAsync", (void *)fMemDiscardBatchAsync},
	{"cuMemDiscardAndPrefetchBatchAsync", (void *)fMemDiscardAndPrefetchBatchAsync},
	{"cuMemAllocAsync", (void *)fMemAllocAsync},
	{"cuMemFreeAsync", (void *)fMemFreeAsync},
	{"cuMemAllocFromPoolAsync", (void *)fMemAllocFromPoolAsync},
	{"cuMemPoolCreate", (void *)fMemPoolCreate},
	{"cuMemPoolDestroy", (void *)fMemPoolDestroy},
	{"cuMemPoolSetAttribute", (void *)fMemPoolSetAttribute},
	{"cuMemPoolGetAttribute", (void *)fMemPoolGetAttribute},
	{"cuMemPoolTrimTo", (void *)fMemPoolTrimTo},
	{"cuMemPoolSetAccess", (void *)fMemPoolSetAccess},
	{"cuMemPoolGetAccess", (void *)fMemPoolGetAccess},
	{"cuMemPoolExportToShareableHandle", (void *)fMemPoolExportToShareableHandle},
	{"cuMemPoolImportFromShareableHandle", (void *)fMemPoolImportFromShareableHandle},
	{"cuMemPoolExportPointer", (void *)fMemPoolExportPointer},
	{"cuMemPoolImportPointer", (void *)fMemPoolImportPointer},
	{"cuMemCreate", (void *)fMemCreate},
	{"cuMemRelease", (void *)fMemRelease},
	{"cuMemAddressReserve", (void *)fMemAddressReserve},
	{"cuMemAddressFree", (void *)fMemAddressFree},
	{"cuMemMap", (void *)fMemMap},
	{"cuMemUnmap", (void *)fMemUnmap},
	{"cuMemSetAccess", (void *)fMemSetAccess},
	{"cuMemGetAccess", (void *)fMemGetAccess},
	{"cuMemGetAllocationGranularity", (void *)fMemGetAllocationGranularity},
	{"cuMemExportToShareableHandle", (void *)fMemExportToShareableHandle},
	{"cuMemImportFromShareableHandle", (void *)fMemImportFromShareableHandle},
	{"cuMemRetainAllocationHandle", (void *)fMemRetainAllocationHandle},
	{"cuMemGetAllocationPropertiesFromHandle", (void *)fMemGetAllocationPropertiesFromHandle},
	{"cuIpcGetMemHandle", (void *)fIpcGetMemHandle},
	{"cuIpcOpenMemHandle", (void *)fIpcOpenMemHandle},
	{"cuIpcCloseMemHandle", (void *)fIpcCloseMemHandle},
	{"cuIpcOpenEventHandle", (void *)fIpcOpenEventHandle},
	/* Contexts made elsewhere. */
	{"cuCtxDestroy", (void *)fCtxDestroy},
	{"cuCtxPopCurrent", (void *)fCtxPopCurrent},
	{"cuCtxGetId", (void *)fCtxGetId},
	{"cuStreamGetCtx", (void *)fStreamGetCtx},
	{"cuDeviceGetDevResource", (void *)fDeviceGetDevResource},
	{"cuDevSmResourceSplitByCount", (void *)fDevSmResourceSplitByCount},
	{"cuDevResourceGenerateDesc", (void *)fDevResourceGenerateDesc},
	{"cuGreenCtxCreate", (void *)fGreenCtxCreate},
	{"cuCtxFromGreenCtx", (void *)fCtxFromGreenCtx},
	{"cuGreenCtxDestroy", (void *)fGreenCtxDestroy},
	{"cuGreenCtxStreamCreate", (void *)fGreenCtxStreamCreate},
	/* Stream capture and graphs. */
	{"cuStreamBeginCapture", (void *)fStreamBeginCapture},
	{"cuStreamEndCapture", (void *)fStreamEndCapture},
	{"cuStreamIsCapturing", (void *)fStreamIsCapturing},
	{"cuStreamGetCaptureInfo", (void *)fStreamGetCaptureInfo},
	{"cuGraphInstantiateWithFlags", (void *)fGraphInstantiateWithFlags},
	{"cuGraphLaunch", (void *)fGraphLaunch},
	{"cuGraphDestroy", (void *)fGraphDestroy},
	{"cuGraphExecDestroy", (void *)fGraphExecDestroy},
	{"cuDeviceGraphMemTrim", (void *)fDeviceGraphMemTrim},
	{"cuDeviceGetGraphMemAttribute", (void *)fDeviceGetGraphMemAttribute},
	{"cuDeviceSetGraphMemAttribute", (void *)fDeviceSetGraphMemAttribute},
	/* Modules and kernels: cudamem's own test kernels only. */
	{"cuModuleLoadData", (void *)fModuleLoadData},
	{"cuModuleUnload", (void *)fModuleUnload},
	{"cuModuleGetFunction", (void *)fModuleGetFunction},
	{"cuLaunchKernel", (void *)fLaunchKernel},
	/* Batched copies. */
};

CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, u64 flags, int *status) {
	if (!sym || !pfn) return E_INVALID_VALUE;
	*pfn = 0;
	if (ver > driver_version) {
		if (status) *status = 2; /* version not sufficient */
		return E_NOT_SUPPORTED;
	}
	/* cuMemPrefetchAsync and cuMemAdvise changed ABI at 12.2: we only
	   have the new one. */
	if (ver < 12020 && (!strcmp(sym, "cuMemPrefetchAsync") || !strcmp(sym, "cuMemAdvise"))) {
		if (status) *status = 1;
		return OK;
	}
	/* Batched copies: the ABI depends on the version asked for. */
	if (!strcmp(sym, "cuMemcpyBatchAsync")) *pfn = batch_proc(ver);
	if (!*pfn) *pfn = ctx_proc(sym, ver);
	if (!*pfn && ver >= 12080) *pfn = ckpt_proc(sym);
	for (size_t i = 0; !*pfn && i < sizeof table / sizeof table[0]; i++)
		if (!strcmp(sym, table[i].name)) { *pfn = table[i].fn; break; }
	if (status) *status = *pfn ? 0 : 1;
	return OK;
}
