/* An NVTX injection library standing in for Nsight Systems where it is not installed: loaded
 * by NVTX_INJECTION64_PATH=/path/nvtx_probe.so, it counts the ranges the process starts
 * (nvtxRangeStartA: the nvtx crate's range_start!) by name and the ranges it ends, and prints
 * both to stderr at exit. Build: cc -shared -fPIC -O2 -o nvtx_probe.so nvtx_probe.c */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MODULE_CORE = 1, CORE_RANGE_START_A = 5, CORE_RANGE_END = 7, EXPORT_CALLBACKS = 1 };
enum { MAX_NAMES = 512, NAME_LEN = 64 };

typedef void (*function)(void);
typedef function **function_table;
typedef struct {
    size_t struct_size;
    int (*get_module_function_table)(int module, function_table *table, unsigned int *size);
} callbacks;
typedef const void *(*get_export_table)(uint32_t id);

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char names[MAX_NAMES][NAME_LEN];
static long starts[MAX_NAMES];
static int distinct;
static long ends, other_starts;
static uint64_t next_id = 1;

static uint64_t range_start_a(const char *message) {
    pthread_mutex_lock(&lock);
    int i = 0;
    while (i < distinct && strncmp(names[i], message, NAME_LEN - 1) != 0) i++;
    if (i == distinct && distinct < MAX_NAMES) {
        strncpy(names[i], message, NAME_LEN - 1);
        distinct++;
    }
    if (i < distinct) starts[i]++; else other_starts++;
    uint64_t id = next_id++;
    pthread_mutex_unlock(&lock);
    return id;
}

static void range_end(uint64_t id) {
    (void)id;
    pthread_mutex_lock(&lock);
    ends++;
    pthread_mutex_unlock(&lock);
}

static void report(void) {
    long total = other_starts;
    for (int i = 0; i < distinct; i++) total += starts[i];
    fprintf(stderr, "nvtx-probe: %ld ranges started, %ld ended, %d names\n", total, ends, distinct);
    for (int i = 0; i < distinct; i++) fprintf(stderr, "nvtx-probe: %8ld  %s\n", starts[i], names[i]);
}

int InitializeInjectionNvtx2(get_export_table get) {
    const callbacks *cb = (const callbacks *)get(EXPORT_CALLBACKS);
    function_table table = 0;
    unsigned int size = 0;
    if (!cb || !cb->get_module_function_table(MODULE_CORE, &table, &size) || size < CORE_RANGE_END)
        return 0;
    *table[CORE_RANGE_START_A] = (function)range_start_a;
    *table[CORE_RANGE_END] = (function)range_end;
    atexit(report);
    return 1;
}
