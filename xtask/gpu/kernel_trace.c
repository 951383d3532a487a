/* A CUPTI injection library that records every kernel and copy a process runs on its GPUs,
 * with device start and end times, where Nsight Systems is not installed: loaded by the CUDA
 * driver through CUDA_INJECTION64_PATH=/path/kernel_trace.so, it writes one CSV per process,
 * $KERNEL_TRACE_DIR/kernels-<pid>.csv, with a row per kernel, copy or memset:
 *   kind,device,stream,channel,graph,correlation,start_ns,end_ns,name
 * (channel: the hardware channel the work went through; a copy's name gives its direction,
 * source and destination memory kinds and bytes, a memset's its bytes)
 * With KERNEL_TRACE_API=1 it also writes a row per CUDA driver call, on the same clock
 * (kind `api`, stream = the calling thread, name = the call): where the host waited.
 * Kernels replayed from a CUDA graph come one row each (graph = the graph's id, correlation =
 * the graph launch's), so one replay's rows share their correlation id; NCCL's kernels are
 * rows like the others. `xtask/python/kernel_steps.py` reads the files.
 * Tracing perturbs what it measures: memset and copy nodes of a graph cost several
 * microseconds more under it (docs/history/2026-11.md, eighteenth session: a traced ResNet-50 step idled
 * 0.3 ms around its 55 memsets, which cost nothing measurable untraced); compare kernels and
 * rates against an untraced run before acting on them.
 * Build: cc -shared -fPIC -O2 -I<cupti include> -I<CUDA include> -o kernel_trace.so
 *        kernel_trace.c -L<cupti lib> -l:libcupti.so.13 (the GPU machine's pip headers lack
 *        crt/host_defines.h: build it where the CUDA toolkit is and carry it in the bundle) */
#include <cupti.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { BUFFER_BYTES = 8 << 20, ALIGN = 8 };

static FILE *out;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(ALIGN, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void write_kernel(const CUpti_ActivityKernel10 *k) {
    fprintf(out, "kernel,%u,%u,%u,%u,%u,%llu,%llu,%s\n", k->deviceId, k->streamId, k->channelID,
            k->graphId, k->correlationId, (unsigned long long)k->start,
            (unsigned long long)k->end, k->name ? k->name : "?");
}

static void write_copy(const CUpti_ActivityMemcpy6 *m) {
    fprintf(out, "copy,%u,%u,%u,%u,%u,%llu,%llu,copy kind %u from %u to %u %llu bytes\n",
            m->deviceId, m->streamId, m->channelID, m->graphId, m->correlationId,
            (unsigned long long)m->start, (unsigned long long)m->end, (unsigned)m->copyKind,
            (unsigned)m->srcKind, (unsigned)m->dstKind, (unsigned long long)m->bytes);
}

static void write_memset(const CUpti_ActivityMemset4 *m) {
    fprintf(out, "memset,%u,%u,%u,%u,%u,%llu,%llu,memset %llu bytes\n", m->deviceId,
            m->streamId, m->channelID, m->graphId, m->correlationId,
            (unsigned long long)m->start, (unsigned long long)m->end,
            (unsigned long long)m->bytes);
}

static void write_api(const CUpti_ActivityAPI *a) {
    const char *name = "?";
    cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, &name);
    fprintf(out, "api,0,%u,0,0,%u,%llu,%llu,%s\n", a->threadId, a->correlationId,
            (unsigned long long)a->start, (unsigned long long)a->end, name);
}

static void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t *buffer,
                                      size_t size, size_t valid) {
    (void)context;
    (void)stream;
    (void)size;
    CUpti_Activity *record = NULL;
    pthread_mutex_lock(&lock);
    while (out && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
        if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
            record->kind == CUPTI_ACTIVITY_KIND_KERNEL)
            write_kernel((const CUpti_ActivityKernel10 *)record);
        else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY)
            write_copy((const CUpti_ActivityMemcpy6 *)record);
        else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET)
            write_memset((const CUpti_ActivityMemset4 *)record);
        else if (record->kind == CUPTI_ACTIVITY_KIND_DRIVER)
            write_api((const CUpti_ActivityAPI *)record);
    }
    pthread_mutex_unlock(&lock);
    free(buffer);
}

static void flush_at_exit(void) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    pthread_mutex_lock(&lock);
    if (out) fclose(out);
    out = NULL;
    pthread_mutex_unlock(&lock);
}

static int fail(const char *what, CUptiResult result) {
    const char *text = "?";
    cuptiGetResultString(result, &text);
    fprintf(stderr, "kernel_trace: %s failed: %s\n", what, text);
    return 0;
}

/* Called by the CUDA driver when it loads this library (CUDA_INJECTION64_PATH). */
int InitializeInjection(void) {
    const char *dir = getenv("KERNEL_TRACE_DIR");
    if (!dir) {
        fprintf(stderr, "kernel_trace: KERNEL_TRACE_DIR is not set; nothing is recorded\n");
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/kernels-%d.csv", dir, (int)getpid());
    out = fopen(path, "w");
    if (!out) {
        fprintf(stderr, "kernel_trace: cannot write %s\n", path);
        return 1;
    }
    fprintf(out, "kind,device,stream,channel,graph,correlation,start_ns,end_ns,name\n");
    CUptiResult r = cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_SUCCESS) return fail("cuptiActivityRegisterCallbacks", r);
    r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (r != CUPTI_SUCCESS) return fail("enabling kernel records", r);
    r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    if (r != CUPTI_SUCCESS) return fail("enabling copy records", r);
    r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
    if (r != CUPTI_SUCCESS) return fail("enabling memset records", r);
    const char *api = getenv("KERNEL_TRACE_API");
    if (api && strcmp(api, "1") == 0) {
        r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER);
        if (r != CUPTI_SUCCESS) return fail("enabling driver call records", r);
    }
    atexit(flush_at_exit);
    return 1;
}
