/* The fault gate's host step in C (iris_jax/calls/fault_gate.py says what the gate does and why).
 *
 * XLA calls it at the PREPARE and EXECUTE stages of every execution, on its own threads, while the
 * Python thread that dispatches programs usually holds the GIL: a handler that needed the GIL
 * would wait for it at every call. This one touches Python only to word an error.
 *
 * The XLA FFI structures are in xla_ffi.h.
 * The fault page's layout comes from iris_core.faults (-D flags at build time).
 */
#include <dlfcn.h>

#include "xla_ffi.h"

enum { OFF = 0, STEP = 1, CALL = 2 };
#define MAX_DEVICES 64

typedef int (*CtxGetDevice)(int *);
typedef int (*MemcpyDtoHAsync)(void *, uint64_t, size_t, void *);
typedef int (*MemsetD32Async)(uint64_t, unsigned int, size_t, void *);
typedef int (*StreamSynchronize)(void *);
typedef int (*CtxSynchronize)(void);
typedef void (*Formatter)(int device, char *message, size_t size);  /* words the fault */

static CtxGetDevice ctx_get_device;
static MemcpyDtoHAsync memcpy_dtoh_async;
static MemsetD32Async memset_d32_async;
static StreamSynchronize stream_synchronize;
static CtxSynchronize ctx_synchronize;
static Formatter formatter;
static volatile int mode = STEP;
static int64_t *volatile pages[MAX_DEVICES];      /* a device's rank's fault page (host memory) */
static volatile uint64_t status_words[MAX_DEVICES]; /* the device address of its heap's status word */

int64_t iris_gate_waited, iris_gate_passed;  /* gates that waited / passed (benchmarks read them) */

static __thread int64_t run_seen = -1;  /* this thread's execution, and its anchors still to run */
static __thread int64_t anchors_pending;

int iris_gate_start(Formatter format) {
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!driver) return 1;
    ctx_get_device = (CtxGetDevice)dlsym(driver, "cuCtxGetDevice");
    memcpy_dtoh_async = (MemcpyDtoHAsync)dlsym(driver, "cuMemcpyDtoHAsync_v2");
    memset_d32_async = (MemsetD32Async)dlsym(driver, "cuMemsetD32Async");
    stream_synchronize = (StreamSynchronize)dlsym(driver, "cuStreamSynchronize");
    ctx_synchronize = (CtxSynchronize)dlsym(driver, "cuCtxSynchronize");
    formatter = format;
    return !(ctx_get_device && memcpy_dtoh_async && memset_d32_async && stream_synchronize && ctx_synchronize);
}

void iris_gate_set_mode(int m) { mode = m; }

/* A device's rank (page NULL: none, e.g. after shutdown). */
void iris_gate_set_device(int device, int64_t *page, uint64_t status_word) {
    if (device < 0 || device >= MAX_DEVICES) return;
    status_words[device] = status_word;
    pages[device] = page;
}

static int query(CallFrame *frame, int function, void **value) {
    size_t offset = offsetof(Api, functions) + sizeof(void *) * (function + 1);
    if (frame->api->struct_size < offset) return 0;
    QueryArgs args = {sizeof(QueryArgs), NULL, frame->ctx, NULL};
    if (((Query)frame->api->functions[function])(&args)) return 0;
    *value = args.value;
    return 1;
}

static int recorded_a_fault(const int64_t *page) {
    for (int p = 0; p < SLOTS; p++)
        if (page[SLOTS_AT + p * SLOT]) return 1;
    return 0;
}

/* Whether the device's rank recorded a fault or a refused access, once `stream`'s work is done. */
static int faulted(int device, void *stream) {
    int64_t *page = pages[device];
    memcpy_dtoh_async(page + STATUS_COPY, status_words[device], 8, stream);
    stream_synchronize(stream);
    return page[STATUS_COPY] || recorded_a_fault(page);
}

/* A refused access alone is reported once, by the execution that made it (as the simulator's call
 * raises it): its status word is cleared. A fault record stays for check_faults (its group's flags
 * are poisoned; the next call of the group fails as well). */
static void report_refusal_once(int device, void *stream) {
    int64_t *page = pages[device];
    if (!page[STATUS_COPY] || recorded_a_fault(page)) return;
    memset_d32_async(status_words[device], 0, 2, stream);
    stream_synchronize(stream);
    page[STATUS_COPY] = 0;
}

static void *gate(CallFrame *frame, int anchor) {
    if (answered_metadata(frame, NO_TRAITS)) return NULL;  /* not capturable: it runs on the host every time */
    void *run = NULL;
    if (query(frame, RUN_ID_GET, &run) && (int64_t)run != run_seen) {
        run_seen = (int64_t)run;  /* a new execution: an aborted one leaves no count behind */
        anchors_pending = 0;
    }
    if (frame->stage == PREPARE) {
        anchors_pending += anchor;
        return NULL;
    }
    if (frame->stage != EXECUTE) return NULL;
    if (anchor && anchors_pending > 0) anchors_pending--;
    int device = -1;
    if (mode == OFF || (mode == STEP && anchors_pending > 0) || ctx_get_device(&device) || device < 0 ||
        device >= MAX_DEVICES || !pages[device]) {
        __atomic_add_fetch(&iris_gate_passed, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    __atomic_add_fetch(&iris_gate_waited, 1, __ATOMIC_RELAXED);
    void *stream = NULL;
    if (!query(frame, STREAM_GET, &stream)) {
        ctx_synchronize();
        stream = NULL;
    }
    if (!faulted(device, stream)) return NULL;
    anchors_pending = 0;  /* XLA runs nothing more of this execution */
    static __thread char message[4096];  /* XLA copies it */
    message[0] = 0;
    formatter(device, message, sizeof(message));
    report_refusal_once(device, stream);
    return ffi_error(frame, message);
}

void *iris_fault_gate(CallFrame *frame) { return gate(frame, 1); }
void *iris_fault_gate_nested(CallFrame *frame) { return gate(frame, 0); }

/* An anchor that a later anchor of its function took over: XLA captures it into its CUDA graph,
 * where it runs nothing (it only orders the chain of its function's gates). */
void *iris_fault_gate_passed(CallFrame *frame) {
    answered_metadata(frame, COMMAND_BUFFER_COMPATIBLE);
    return NULL;
}
