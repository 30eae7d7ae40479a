// A fake CUDA driver for CPU tests of the loader: just enough entry points
// to exercise bootstrap, cuGetProcAddress versioning, missing symbols and
// the context-setting call path. Built by the tests with the system C
// compiler; never shipped.
#include <string.h>

static int driver_version = 12040;
static int init_result = 0;
static void *current_ctx = 0;
static int last_requested_version = 0;
static int device_count = 3;
static int device_get_limit = 1 << 30; /* cuDeviceGet fails from this ordinal on */
static int attribute_value = 0;         /* what cuDeviceGetAttribute reports */
static unsigned long long granularity = 2 << 20;

void fake_set_version(int v) { driver_version = v; }
void fake_set_init_result(int r) { init_result = r; }
int fake_last_requested_version(void) { return last_requested_version; }
/* A driver may report any count, even a negative one: package cuda must cope. */
void fake_set_device_count(int n) { device_count = n; }
void fake_set_device_get_limit(int n) { device_get_limit = n; }
void fake_set_attribute(int v) { attribute_value = v; }
void fake_set_granularity(unsigned long long g) { granularity = g; }

int cuDriverGetVersion(int *v) { *v = driver_version; return 0; }
int cuInit(unsigned int flags) { return flags != 0 ? 1 : init_result; }

static int fake_ctx_set_current(void *ctx) {
	if (ctx == (void *)0xbad) return 201; /* CUDA_ERROR_INVALID_CONTEXT */
	current_ctx = ctx;
	return 0;
}
static int fake_ctx_get_current(void **ctx) { *ctx = current_ctx; return 0; }
static int fake_device_get_count(int *n) { *n = device_count; return 0; }
static int fake_device_get(int *dev, int ordinal) {
	if (ordinal < 0 || ordinal >= device_count || ordinal >= device_get_limit) return 101; /* CUDA_ERROR_INVALID_DEVICE */
	*dev = ordinal;
	return 0;
}
static int fake_device_get_attribute(int *v, int attr, int dev) { *v = attribute_value; return 0; }
static int fake_mem_get_allocation_granularity(unsigned long long *g, const void *prop, int option) {
	*g = granularity;
	return 0;
}
/* Fills the whole buffer with no terminating NUL, as a hostile driver might. */
static int fake_device_get_name(char *name, int len, int dev) {
	memset(name, 'X', len > 0 ? (size_t)len : 0);
	return 0;
}
/* Old (device ordinal) and new (CUmemLocation by value) cuMemAdvise ABIs:
   each returns a value that tells the test which one it reached. */
static int fake_mem_advise_v1(unsigned long long p, unsigned long n, int a, int dev) { return 1001; }
static int fake_mem_advise_v2(unsigned long long p, unsigned long n, int a, unsigned long long loc) { return 1002; }
/* Sums its sixteen arguments, so the test proves stack arguments arrive. */
static unsigned long fake_sum16(unsigned long a1, unsigned long a2, unsigned long a3, unsigned long a4,
	unsigned long a5, unsigned long a6, unsigned long a7, unsigned long a8, unsigned long a9,
	unsigned long a10, unsigned long a11, unsigned long a12, unsigned long a13, unsigned long a14,
	unsigned long a15, unsigned long a16) {
	return a1 + 2*a2 + 3*a3 + 4*a4 + 5*a5 + 6*a6 + 7*a7 + 8*a8 + 9*a9 + 10*a10 + 11*a11 +
		12*a12 + 13*a13 + 14*a14 + 15*a15 + 16*a16;
}

int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
	last_requested_version = ver;
	*pfn = 0;
	if (ver > driver_version) return 1; /* CUDA_ERROR_INVALID_VALUE */
	if (!strcmp(sym, "cuCtxSetCurrent")) *pfn = (void *)fake_ctx_set_current;
	else if (!strcmp(sym, "cuCtxGetCurrent")) *pfn = (void *)fake_ctx_get_current;
	else if (!strcmp(sym, "cuDeviceGetCount")) *pfn = (void *)fake_device_get_count;
	else if (!strcmp(sym, "cuDeviceGet")) *pfn = (void *)fake_device_get;
	else if (!strcmp(sym, "cuDeviceGetName")) *pfn = (void *)fake_device_get_name;
	else if (!strcmp(sym, "cuDeviceGetAttribute")) *pfn = (void *)fake_device_get_attribute;
	else if (!strcmp(sym, "cuMemGetAllocationGranularity")) *pfn = (void *)fake_mem_get_allocation_granularity;
	else if (!strcmp(sym, "cuMemAdvise")) *pfn = ver >= 12020 ? (void *)fake_mem_advise_v2 : (void *)fake_mem_advise_v1;
	else if (!strcmp(sym, "cuLaunchKernel")) *pfn = (void *)fake_sum16;
	if (status) *status = *pfn ? 0 : 1;
	return 0;
}

/* Returns the callee's frame address modulo 16: 0 when the caller kept the
   stack aligned as the ABI requires (the tests build this file with frame
   pointers). */
unsigned long fake_stack_misalignment(void) {
	return (unsigned long)__builtin_frame_address(0) & 15;
}
