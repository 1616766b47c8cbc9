/* check_main.h — every unit test file is its own Check runner, so modules
 * (and the people writing them) never edit a shared list of suites. */
#ifndef TP_CHECK_MAIN_H
#define TP_CHECK_MAIN_H

#include <check.h>
#include <stdlib.h>

/* Runs a suite; the exit status main returns. */
static inline int tp_check_run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#define TP_CHECK_MAIN(suite_fn) \
    int main(void) { return tp_check_run(suite_fn()); }

#endif
