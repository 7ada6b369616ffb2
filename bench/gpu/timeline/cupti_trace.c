// A device timeline for a CUDA program that cannot be changed for it: loaded
// by the driver through CUDA_INJECTION64_PATH (the way Nsight Systems injects
// itself; the GPU machine has no nsys), it records with CUPTI's activity API
//   K start end stream name          every kernel
//   M start end stream kind bytes    every memcpy (kind: 1 HtoD, 2 DtoH, ...)
//   A start end thread name          driver calls of 50 us or more, and every
//                                    synchronisation call, by host thread
// into $CUPTI_TRACE_OUT (one text line each; timestamps in ns on CUPTI's
// clock, shared by all three). bench/gpu/timeline/timeline.py reads it.
//
// Built on the dev machine against the CUPTI 13.0 wheel's headers
// (bench/gpu/timeline/build.sh); libcupti.so.13 travels beside it.
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUFFER_BYTES (16u << 20)
#define MIN_API_NS 50000ull

static FILE *out;

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  *buffer = (uint8_t *)aligned_alloc(ACTIVITY_RECORD_ALIGNMENT, BUFFER_BYTES);
  *size = BUFFER_BYTES;
  *max_records = 0;
}

static int is_sync(const char *name) {
  return strstr(name, "Synchronize") || strstr(name, "Query") || strstr(name, "WaitEvent");
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid) {
  (void)ctx;
  (void)stream;
  (void)size;
  CUpti_Activity *record = NULL;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) {
      CUpti_ActivityKernel10 *k = (CUpti_ActivityKernel10 *)record;
      fprintf(out, "K %llu %llu %u %s\n", (unsigned long long)k->start, (unsigned long long)k->end,
              k->streamId, k->name ? k->name : "?");
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      CUpti_ActivityMemcpy6 *m = (CUpti_ActivityMemcpy6 *)record;
      fprintf(out, "M %llu %llu %u %u %llu\n", (unsigned long long)m->start,
              (unsigned long long)m->end, m->streamId, (unsigned)m->copyKind,
              (unsigned long long)m->bytes);
    } else if (record->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      CUpti_ActivityAPI *a = (CUpti_ActivityAPI *)record;
      const char *name = "?";
      cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, &name);
      if (a->end - a->start >= MIN_API_NS || is_sync(name)) {
        fprintf(out, "A %llu %llu %u %s\n", (unsigned long long)a->start,
                (unsigned long long)a->end, a->threadId, name);
      }
    }
  }
  free(buffer);
}

static void finish(void) {
  cuptiActivityFlushAll(1);
  if (out) fflush(out);
}

int InitializeInjection(void) {
  const char *path = getenv("CUPTI_TRACE_OUT");
  out = fopen(path ? path : "cupti-trace.txt", "w");
  if (!out) return 0;
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
      cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER) != CUPTI_SUCCESS) {
    fprintf(stderr, "cupti_trace: could not enable CUPTI activities\n");
    return 0;
  }
  atexit(finish);
  fprintf(stderr, "cupti_trace: recording to %s\n", path ? path : "cupti-trace.txt");
  return 1;
}
