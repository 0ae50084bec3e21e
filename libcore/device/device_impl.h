/*
 * device_impl.h -- what the backends (cpu.c, cuda.c) give device.c. Internal to libcore/device.
 */
#ifndef IFLOW_DEVICE_IMPL_H
#define IFLOW_DEVICE_IMPL_H

#include "device.h"

int  iflow_cpu_open(iflow_device **out, int n_threads);
void iflow_cpu_info(iflow_device_info *info);
/* The CPU's pack op and the free of what it returned (d NULL: the host, as iflow_device_pack). */
int  iflow_cpu_pack(iflow_device *d, void **out, int *out_type, const void *W, int wtype, int N, int K);
void iflow_cpu_free(iflow_device *d, void *p);
/* Tests: the CPU's row-wise and element-wise ops split over threads again from the next one on
 * (after a late worker they run on one thread for a while: cpu.c's SPAN_BACKOFF). */
void iflow_cpu_span_reset(void);

/* CUDA (cuda.c): in a build without CUDA these say so with IFLOW_EUNSUPPORTED. */
int  iflow_cuda_open(iflow_device **out, int index);
/* Number of CUDA devices, 0 with *why set when there are none. */
int  iflow_cuda_count(const char **why);
int  iflow_cuda_info(int index, iflow_device_info *info);
void iflow_cuda_graph_stats(const iflow_device *d, iflow_graph_stats *st);

#endif
