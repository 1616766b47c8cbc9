/* Prints the OpenBLAS kernel set this process runs (what OPENBLAS_CORETYPE
 * selected, or what OpenBLAS detected): test_cpus.sh checks that a core type
 * it asked for is really the one in use before it reports on it. */
#include <stdio.h>

char *openblas_get_corename(void);

int main(void)
{
    printf("%s\n", openblas_get_corename());
    return 0;
}
