/*
 * planner/device/plan_kernel_small.cu - the device planner's kernel built at a smaller CTA
 * size, for the data-parallel rows with few tiles (fi_device_plan_launch picks it by the
 * layout's max_tiles, planner/device/plan_kernel.h).  Everything else is plan_kernel.cu.
 * Profiling stamps (make PROFILE=1) come from the default build only.
 */
#define FI_DEVPLAN_THREADS 256
#define FI_DEVPLAN_NS fi_devplan_small
#define FI_DEVPLAN_LAUNCH fi_device_plan_launch_small
#define FI_DEVPLAN_SMALL 1
#undef FI_PROFILE
#include "planner/device/plan_kernel.cu"
