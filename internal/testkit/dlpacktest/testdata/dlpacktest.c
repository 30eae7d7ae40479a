// dlpacktest: a small C library standing in for a DLPack consumer and
// producer in cudamem's tests. Built by the tests with the system C
// compiler; never shipped. The struct definitions are written from the
// DLPack header's documented layout (version 1.x).
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct { uint32_t major, minor; } t_version;
typedef struct { int32_t type, id; } t_device;
typedef struct { uint8_t code, bits; uint16_t lanes; } t_dtype;
typedef struct {
	void *data;
	t_device device;
	int32_t ndim;
	t_dtype dtype;
	int64_t *shape;
	int64_t *strides;
	uint64_t byte_offset;
} t_tensor;
typedef struct t_managed {
	t_tensor tensor;
	void *ctx;
	void (*deleter)(struct t_managed *);
} t_managed;
typedef struct t_versioned {
	t_version version;
	void *ctx;
	void (*deleter)(struct t_versioned *);
	uint64_t flags;
	t_tensor tensor;
} t_versioned;

/* ---- layout facts, for the Go layout tests ---- */
int64_t dlt_layout(int i) {
	switch (i) {
	case 0: return sizeof(t_tensor);
	case 1: return sizeof(t_managed);
	case 2: return sizeof(t_versioned);
	case 3: return offsetof(t_tensor, byte_offset);
	case 4: return offsetof(t_versioned, tensor);
	case 5: return offsetof(t_managed, deleter);
	case 6: return offsetof(t_versioned, flags);
	case 7: return offsetof(t_tensor, shape);
	}
	return -1;
}

/* ---- consumer side ---- */

/* dlt_describe writes a versioned (v != 0) or unversioned tensor's fields
   into out: major, minor, flags, device type, device id, ndim, code,
   bits, lanes, shape[0] (or -1), strides (0 or 1), byte_offset, data. */
int dlt_describe(void *p, int v, int64_t *out) {
	t_tensor *t;
	if (v) {
		t_versioned *m = p;
		out[0] = m->version.major;
		out[1] = m->version.minor;
		out[2] = (int64_t)m->flags;
		t = &m->tensor;
	} else {
		out[0] = out[1] = out[2] = -1;
		t = &((t_managed *)p)->tensor;
	}
	out[3] = t->device.type;
	out[4] = t->device.id;
	out[5] = t->ndim;
	out[6] = t->dtype.code;
	out[7] = t->dtype.bits;
	out[8] = t->dtype.lanes;
	out[9] = t->ndim > 0 && t->shape ? t->shape[0] : -1;
	out[10] = t->strides != 0;
	out[11] = (int64_t)t->byte_offset;
	out[12] = (int64_t)(uintptr_t)t->data;
	return 0;
}

static t_tensor *tensor_of(void *p, int v) {
	return v ? &((t_versioned *)p)->tensor : &((t_managed *)p)->tensor;
}

/* dlt_fill sets every byte of a 1-D host-reachable tensor to c. */
void dlt_fill(void *p, int v, int c) {
	t_tensor *t = tensor_of(p, v);
	memset((char *)t->data + t->byte_offset, c, (size_t)t->shape[0]);
}

/* dlt_sum adds up the bytes of a 1-D host-reachable tensor. */
uint64_t dlt_sum(void *p, int v) {
	t_tensor *t = tensor_of(p, v);
	uint64_t s = 0;
	unsigned char *d = (unsigned char *)t->data + t->byte_offset;
	for (int64_t i = 0; i < t->shape[0]; i++) s += d[i];
	return s;
}

static void call_deleter(void *p, int v) {
	if (v) {
		t_versioned *m = p;
		if (m->deleter) m->deleter(m);
	} else {
		t_managed *m = p;
		if (m->deleter) m->deleter(m);
	}
}

/* dlt_delete calls the tensor's deleter on this thread. */
void dlt_delete(void *p, int v) { call_deleter(p, v); }

/* dlt_delete_ret calls the tensor's deleter on this thread and returns
   tag: the Go caller checks that the result of a call whose callback ran
   Go code (and may have moved the calling goroutine's stack) arrives. */
uint64_t dlt_delete_ret(void *p, int v, uint64_t tag) {
	call_deleter(p, v);
	return tag;
}

/* dlt_delete_raw calls deleter fn with argument p, whatever p is. */
void dlt_delete_raw(void (*fn)(void *), void *p) { fn(p); }

struct job { void *p; int v; };
static void *run(void *a) {
	struct job *j = a;
	call_deleter(j->p, j->v);
	return 0;
}

/* dlt_delete_thread calls the tensor's deleter on a new thread and waits
   for it: a thread the Go runtime never saw. Returns 0 on success. */
int dlt_delete_thread(void *p, int v) {
	pthread_t th;
	struct job j = {p, v};
	if (pthread_create(&th, 0, run, &j)) return -1;
	return pthread_join(th, 0);
}

/* dlt_delete_threads calls n tensors' deleters from n threads at once. */
int dlt_delete_threads(void **ps, int v, int n) {
	pthread_t th[64];
	struct job j[64];
	if (n > 64) return -1;
	for (int i = 0; i < n; i++) {
		j[i].p = ps[i];
		j[i].v = v;
		if (pthread_create(&th[i], 0, run, &j[i])) return -1;
	}
	for (int i = 0; i < n; i++) pthread_join(th[i], 0);
	return 0;
}

/* ---- producer side ---- */

static int64_t deleted;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

int64_t dlt_deleted(void) {
	pthread_mutex_lock(&mu);
	int64_t n = deleted;
	pthread_mutex_unlock(&mu);
	return n;
}

static void free_tensor(t_tensor *t) {
	free(t->shape);
	free(t->strides);
}
static void del_versioned(t_versioned *m) {
	pthread_mutex_lock(&mu);
	deleted++;
	pthread_mutex_unlock(&mu);
	free_tensor(&m->tensor);
	free(m);
}
static void del_managed(t_managed *m) {
	pthread_mutex_lock(&mu);
	deleted++;
	pthread_mutex_unlock(&mu);
	free_tensor(&m->tensor);
	free(m);
}

/* dlt_make builds a tensor whose deleter counts its calls (dlt_deleted)
   and frees it. spec: device type, device id, ndim, code, bits, lanes,
   byte_offset, flags, major version, has strides. dims holds ndim shape
   values then, with strides, ndim strides. */
void *dlt_make(int v, void *data, const int64_t *spec, const int64_t *dims) {
	int ndim = (int)spec[2];
	t_tensor t = {0};
	t.data = data;
	t.device.type = (int32_t)spec[0];
	t.device.id = (int32_t)spec[1];
	t.ndim = ndim;
	t.dtype.code = (uint8_t)spec[3];
	t.dtype.bits = (uint8_t)spec[4];
	t.dtype.lanes = (uint16_t)spec[5];
	t.byte_offset = (uint64_t)spec[6];
	if (ndim > 0) {
		t.shape = malloc(sizeof(int64_t) * ndim);
		memcpy(t.shape, dims, sizeof(int64_t) * ndim);
		if (spec[9]) {
			t.strides = malloc(sizeof(int64_t) * ndim);
			memcpy(t.strides, dims + ndim, sizeof(int64_t) * ndim);
		}
	}
	if (v) {
		t_versioned *m = calloc(1, sizeof *m);
		m->version.major = (uint32_t)spec[8];
		m->version.minor = 1;
		m->flags = (uint64_t)spec[7];
		m->deleter = del_versioned;
		m->tensor = t;
		return m;
	}
	t_managed *m = calloc(1, sizeof *m);
	m->deleter = del_managed;
	m->tensor = t;
	return m;
}

void *dlt_alloc(size_t n) { return calloc(1, n ? n : 1); }
void dlt_free(void *p) { free(p); }
