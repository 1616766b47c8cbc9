/* cpu_backend.h — ranks are threads, symmetric memory is ordinary memory
 * every thread can address, and capture records a command list. */
#ifndef TP_CPU_BACKEND_H
#define TP_CPU_BACKEND_H

#include "backend.h"

tp_status tp_cpu_backend_create(int world, tp_backend **out, tp_err *err);

#endif
