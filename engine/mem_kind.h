/* mem_kind.h — the memory arenas of a plan (plan.h explains each), public
 * because the engine's statistics report bytes per arena (engine.h). */
#ifndef TP_MEM_KIND_H
#define TP_MEM_KIND_H

typedef enum { TP_MEM_NONE = 0, TP_MEM_REGULAR, TP_MEM_SYMMETRIC, TP_MEM_INPUT, TP_MEM_OUTPUT, TP_MEM_KINDS } tp_mem_kind;

/* "regular", "symmetric", "input", "output" ("none" for TP_MEM_NONE). */
const char *tp_mem_kind_name(tp_mem_kind k);

#endif
