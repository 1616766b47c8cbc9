/* fuzz_error.h — what every harness asks of an error it is given: the
 * message is printed or sent as it is, so it must be one terminated line. */
#ifndef TP_FUZZ_ERROR_H
#define TP_FUZZ_ERROR_H

#include <stdlib.h>
#include <string.h>

#include "status.h"

static inline void fuzz_check_error_line(const tp_err *e)
{
    if (!memchr(e->msg, '\0', sizeof e->msg) || strchr(e->msg, '\n'))
        abort();
}

#endif
