// fakenccl: a fake NCCL for CPU tests of the nccl-allreduce example. It
// runs over cudamem's fake CUDA driver (internal/testkit/fakecuda), whose "device"
// memory is host memory, so a float32 sum is a loop over host memory.
//
// It is strict where the example could go wrong without a GPU noticing:
//   - calls that use the current device (ncclCommInitRankScalable,
//     ncclAllReduce, ncclCommWindowRegister) fail unless a context of the
//     communicator's device is current on the calling thread (the fake
//     driver's cuCtxGetDevice);
//   - group state is per thread, as NCCL's: a collective over several
//     communicators of one process outside ncclGroupStart/End fails (NCCL
//     would wait forever), and so does a group that leaves a rank out;
//   - ncclCommWindowRegister writes its window at ncclGroupEnd when
//     called in a group, as NCCL does;
//   - ncclCommDeregister of an unknown or already deregistered handle, and
//     ncclCommDestroy with registrations or windows still live, fail;
//   - ncclCommInitRankScalable checks the id came from ncclGetUniqueId.
// Several ranks exist only inside one process (ncclCommInitAll);
// ncclCommInitRankScalable makes one-rank communicators only.
//
// Environment: FAKENCCL_VERSION (ncclGetVersion's code, default 22803);
// FAKENCCL_WINDOW: "none" makes ncclCommWindowRegister succeed without a
// window (as NCCL does without symmetric support and local registration),
// "refuse" makes it fail. Built with -DFAKENCCL_NO_SCALABLE it lacks
// ncclCommInitRankScalable (an NCCL older than 2.23).
//
// Written from nccl.h's documented signatures and values; built by the
// tests with the system C compiler; never shipped.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int ncclResult_t;
enum { ncclSuccess = 0, ncclSystemError = 2, ncclInternalError = 3, ncclInvalidArgument = 4, ncclInvalidUsage = 5 };

#define MAXCOMMS 16
#define MAXREGS 1024
#define MAXOPS 64
#define IDBYTES 128
static const char idMagic[] = "fakenccl-unique-id:";

struct comm {
	int live, dev, rank, nranks, clique;
};
struct reg {
	struct comm *c;
	void *buf;
	size_t size;
	int live, win;
};
struct op {
	int kind; /* 1 allreduce, 2 window */
	struct comm *c;
	const float *send;
	float *recv;
	size_t count;
	void *buf;
	size_t size;
	void **out;
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct comm comms[MAXCOMMS];
static struct reg regs[MAXREGS];
static int cliques;
static __thread int depth, nops;
static __thread struct op ops[MAXOPS];

static void warn(const char *msg, ...) __attribute__((format(printf, 1, 2)));
static void warn(const char *msg, ...) {
	va_list ap;
	va_start(ap, msg);
	fputs("fakenccl: ", stderr);
	vfprintf(stderr, msg, ap);
	fputc('\n', stderr);
	va_end(ap);
}

/* The fake driver's cuCtxGetDevice, found through cuGetProcAddress_v2 of
   the library CUDAMEM_DRIVER names (already loaded by cudamem). */
static int current_device(void) {
	static int (*get)(int *);
	if (!get) {
		const char *path = getenv("CUDAMEM_DRIVER");
		void *h = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : 0;
		int (*gpa)(const char *, void **, int, unsigned long long, int *) = h ? dlsym(h, "cuGetProcAddress_v2") : 0;
		void *fn = 0;
		if (!gpa || gpa("cuCtxGetDevice", &fn, 12000, 0, 0) || !fn) return -2;
		get = (int (*)(int *))fn;
	}
	int d = -1;
	if (get(&d)) return -1;
	return d;
}

static int on_device(struct comm *c, const char *fn) {
	int d = current_device();
	if (d != c->dev) {
		warn("%s: communicator of device %d called with device %d current (-1: no context, -2: no fake driver)", fn, c->dev, d);
		return 0;
	}
	return 1;
}

static struct comm *as_comm(void *p) {
	struct comm *c = p;
	if (c < comms || c >= comms + MAXCOMMS || !c->live) return 0;
	return c;
}

static int clique_size(int clique) {
	int n = 0;
	for (int i = 0; i < MAXCOMMS; i++)
		if (comms[i].live && comms[i].clique == clique) n++;
	return n;
}

int ncclGetVersion(int *v) {
	const char *e = getenv("FAKENCCL_VERSION");
	if (!v) return ncclInvalidArgument;
	*v = e ? atoi(e) : 22803;
	return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
	switch (r) {
	case ncclSuccess: return "no error";
	case ncclSystemError: return "unhandled system error";
	case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
	case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
	case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
	}
	return "unknown result code";
}

int ncclGetUniqueId(char *id) {
	if (!id) return ncclInvalidArgument;
	memset(id, 0, IDBYTES);
	snprintf(id, IDBYTES, "%s%d", idMagic, (int)getpid());
	for (int i = 64; i < IDBYTES; i++) id[i] = (char)(i * 3 + 1);
	return ncclSuccess;
}

static struct comm *new_comm(int dev, int rank, int nranks, int clique) {
	for (int i = 0; i < MAXCOMMS; i++)
		if (!comms[i].live) {
			comms[i] = (struct comm){.live = 1, .dev = dev, .rank = rank, .nranks = nranks, .clique = clique};
			return &comms[i];
		}
	return 0;
}

int ncclCommInitAll(void **out, int ndev, const int *devlist) {
	if (!out || ndev < 1 || !devlist) return ncclInvalidArgument;
	pthread_mutex_lock(&mu);
	int clique = ++cliques;
	for (int i = 0; i < ndev; i++) {
		for (int j = 0; j < i; j++)
			if (devlist[j] == devlist[i]) {
				warn("ncclCommInitAll: duplicate GPU %d", devlist[i]);
				pthread_mutex_unlock(&mu);
				return ncclInvalidUsage;
			}
		out[i] = new_comm(devlist[i], i, ndev, clique);
		if (!out[i]) {
			pthread_mutex_unlock(&mu);
			return ncclInternalError;
		}
	}
	pthread_mutex_unlock(&mu);
	return ncclSuccess;
}

#ifndef FAKENCCL_NO_SCALABLE
int ncclCommInitRankScalable(void **out, int nranks, int rank, int nId, const char *ids, void *config) {
	if (!out || !ids || nId != 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
	if (config) {
		warn("ncclCommInitRankScalable: the example passes a NULL config");
		return ncclInvalidArgument;
	}
	if (memcmp(ids, idMagic, sizeof idMagic - 1)) {
		warn("ncclCommInitRankScalable: the id did not come from ncclGetUniqueId");
		return ncclInvalidArgument;
	}
	for (int i = 64; i < IDBYTES; i++)
		if (ids[i] != (char)(i * 3 + 1)) {
			warn("ncclCommInitRankScalable: id byte %d damaged", i);
			return ncclInvalidArgument;
		}
	if (nranks != 1) {
		warn("ncclCommInitRankScalable: the fake joins no other process (%d ranks asked)", nranks);
		return ncclInvalidUsage;
	}
	int d = current_device();
	if (d < 0) {
		warn("ncclCommInitRankScalable: no current device (%d)", d);
		return ncclInvalidUsage;
	}
	pthread_mutex_lock(&mu);
	*out = new_comm(d, rank, nranks, ++cliques);
	pthread_mutex_unlock(&mu);
	return *out ? ncclSuccess : ncclInternalError;
}
#endif

int ncclCommDestroy(void *p) {
	pthread_mutex_lock(&mu);
	struct comm *c = as_comm(p);
	if (!c) {
		pthread_mutex_unlock(&mu);
		return ncclInvalidArgument;
	}
	int nreg = 0, nwin = 0;
	for (int i = 0; i < MAXREGS; i++)
		if (regs[i].live && regs[i].c == c) {
			if (regs[i].win) nwin++;
			else nreg++;
		}
	c->live = 0;
	pthread_mutex_unlock(&mu);
	if (nreg || nwin) {
		warn("ncclCommDestroy: %d registrations and %d windows still live", nreg, nwin);
		return ncclInvalidUsage;
	}
	return ncclSuccess;
}

static void *new_reg(struct comm *c, void *buf, size_t size, int win) {
	for (int i = 0; i < MAXREGS; i++)
		if (!regs[i].live) {
			regs[i] = (struct reg){.c = c, .buf = buf, .size = size, .live = 1, .win = win};
			return &regs[i];
		}
	return 0;
}

static ncclResult_t drop_reg(void *comm, void *h, int win, const char *fn) {
	pthread_mutex_lock(&mu);
	struct reg *r = h;
	ncclResult_t res = ncclSuccess;
	if (r < regs || r >= regs + MAXREGS || !r->live || r->win != win || r->c != as_comm(comm)) {
		warn("%s: unknown or already deregistered handle %p", fn, h);
		res = ncclInvalidUsage;
	} else {
		r->live = 0;
	}
	pthread_mutex_unlock(&mu);
	return res;
}

int ncclCommRegister(void *comm, void *buf, size_t size, void **handle) {
	if (!handle || !buf || !size) return ncclInvalidArgument;
	pthread_mutex_lock(&mu);
	struct comm *c = as_comm(comm);
	*handle = c ? new_reg(c, buf, size, 0) : 0;
	pthread_mutex_unlock(&mu);
	if (!c) return ncclInvalidArgument;
	return *handle ? ncclSuccess : ncclInternalError;
}

int ncclCommDeregister(void *comm, void *handle) {
	if (!handle) return ncclSuccess;
	return drop_reg(comm, handle, 0, "ncclCommDeregister");
}

int ncclGroupStart(void) {
	depth++;
	return ncclSuccess;
}

static ncclResult_t run_ops(void);

int ncclGroupEnd(void) {
	if (depth == 0) return ncclInvalidUsage;
	if (--depth > 0) return ncclSuccess;
	ncclResult_t r = run_ops();
	nops = 0;
	return r;
}

static ncclResult_t enqueue(struct op o) {
	if (nops == MAXOPS) return ncclInternalError;
	ops[nops++] = o;
	if (depth > 0) return ncclSuccess;
	ncclResult_t r = run_ops();
	nops = 0;
	return r;
}

/* Every queued op, by clique: each clique's ranks must all be there, with
   the same kind and size. */
static ncclResult_t run_ops(void) {
	ncclResult_t res = ncclSuccess;
	pthread_mutex_lock(&mu);
	for (int i = 0; i < nops; i++) {
		if (!ops[i].c) continue; /* done with an earlier clique */
		int clique = ops[i].c->clique, n = clique_size(clique), got = 0;
		struct op *mine[MAXCOMMS];
		for (int j = i; j < nops; j++)
			if (ops[j].c && ops[j].c->clique == clique) {
				if (ops[j].kind != ops[i].kind || ops[j].count != ops[i].count || ops[j].size != ops[i].size) {
					warn("ranks of one communicator issued different operations in one group");
					res = ncclInvalidUsage;
				}
				if (got < MAXCOMMS) mine[got++] = &ops[j];
			}
		if (got != n) {
			warn("%d of %d ranks of a communicator took part (outside a group, or a rank left out: NCCL would wait forever)", got, n);
			res = ncclInvalidUsage;
		}
		if (res == ncclSuccess && ops[i].kind == 1) {
			size_t count = ops[i].count;
			float *sum = calloc(count ? count : 1, sizeof(float));
			if (!sum) res = ncclSystemError;
			for (int k = 0; sum && k < got; k++)
				for (size_t e = 0; e < count; e++) sum[e] += mine[k]->send[e];
			for (int k = 0; sum && k < got; k++) memcpy(mine[k]->recv, sum, count * sizeof(float));
			free(sum);
		}
		if (res == ncclSuccess && ops[i].kind == 2) {
			for (int k = 0; k < got; k++) {
				*mine[k]->out = new_reg(mine[k]->c, mine[k]->buf, mine[k]->size, 1);
				if (!*mine[k]->out) res = ncclInternalError;
			}
		}
		for (int k = 0; k < got; k++) mine[k]->c = 0;
	}
	pthread_mutex_unlock(&mu);
	return res;
}

int ncclAllReduce(const void *send, void *recv, size_t count, int dtype, int op, void *comm, void *stream) {
	(void)stream;
	struct comm *c = as_comm(comm);
	if (!c || !send || !recv) return ncclInvalidArgument;
	if (dtype != 7 || op != 0) {
		warn("ncclAllReduce: only float32 (7) sums (0), got type %d op %d", dtype, op);
		return ncclInvalidArgument;
	}
	if (!on_device(c, "ncclAllReduce")) return ncclInvalidUsage;
	return enqueue((struct op){.kind = 1, .c = c, .send = send, .recv = recv, .count = count});
}

int ncclCommWindowRegister(void *comm, void *buf, size_t size, void **win, int flags) {
	struct comm *c = as_comm(comm);
	if (!c || !buf || !win) return ncclInvalidArgument;
	*win = 0;
	if (size % 4096 || (unsigned long)buf % 4096 || flags != 1) {
		warn("ncclCommWindowRegister: size %zu and address %p must be multiples of 4096, flags 1 (got %d)", size, buf, flags);
		return ncclInvalidArgument;
	}
	if (!on_device(c, "ncclCommWindowRegister")) return ncclInvalidUsage;
	const char *mode = getenv("FAKENCCL_WINDOW");
	if (mode && !strcmp(mode, "refuse")) {
		warn("ncclCommWindowRegister: refused (FAKENCCL_WINDOW=refuse)");
		return ncclInvalidUsage;
	}
	if (mode && !strcmp(mode, "none")) return ncclSuccess;
	return enqueue((struct op){.kind = 2, .c = c, .buf = buf, .size = size, .out = win});
}

int ncclCommWindowDeregister(void *comm, void *win) {
	if (!win) return ncclSuccess;
	return drop_reg(comm, win, 1, "ncclCommWindowDeregister");
}
