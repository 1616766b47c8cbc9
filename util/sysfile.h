/* sysfile.h — the leading integers of a kernel-made text file (/proc,
 * /sys/fs/cgroup), for the few places that size themselves from what the
 * kernel says this process may use (cores, memory). */
#ifndef TP_SYSFILE_H
#define TP_SYSFILE_H

#include <stdio.h>

/* Up to n whitespace-separated integers from the start of path into v: how
 * many were read (0 when the file cannot be opened or starts otherwise). */
static inline int tp_sysfile_ints(const char *path, long long *v, int n)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return 0;
    int got = 0;
    while (got < n && fscanf(f, "%lld", &v[got]) == 1)
        got++;
    fclose(f);
    return got;
}

#endif
