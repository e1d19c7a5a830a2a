/*
 * plan/device_guard.h - a device plan belongs to the GPU of its workspace: every entry point
 * that touches the device makes that GPU current for the call and gives the caller's
 * current device back afterwards, so plans of several GPUs can be used from one thread in
 * any order (issue 19).  Host C only (the CUDA runtime API).  Not installed.
 */
#ifndef FIATTN_PLAN_DEVICE_GUARD_H
#define FIATTN_PLAN_DEVICE_GUARD_H

#include <cuda_runtime_api.h>

/* The device that holds device memory p (cudaPointerGetAttributes), or -1 when p is not
 * device memory (the caller's current device then stands). */
static inline int fi_pointer_device(const void *p) {
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged ? a.device : -1;
}

/* Make `device` current (device < 0: leave things as they are).  *prev: the device to give
 * back with fi_device_leave, or -1 when nothing was switched (the common case: one
 * cudaGetDevice and no switch). */
static inline cudaError_t fi_device_enter(int device, int *prev) {
    *prev = -1;
    if (device < 0)
        return cudaSuccess;
    int cur = 0;
    cudaError_t e = cudaGetDevice(&cur);
    if (e != cudaSuccess || cur == device)
        return e;
    e = cudaSetDevice(device);
    if (e == cudaSuccess)
        *prev = cur;
    return e;
}

static inline void fi_device_leave(int prev) {
    if (prev >= 0)
        (void)cudaSetDevice(prev);
}

#endif /* FIATTN_PLAN_DEVICE_GUARD_H */
