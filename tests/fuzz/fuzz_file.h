/* fuzz_file.h — for harnesses whose code under test takes a path: the
 * fuzz input written to a file. */
#ifndef TP_FUZZ_FILE_H
#define TP_FUZZ_FILE_H

#include <stdint.h>
#include <stdio.h>

/* 0 once path holds exactly data[0..size), -1 if it could not be written. */
static inline int fuzz_write_file(const char *path, const uint8_t *data, size_t size)
{
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return -1;
    size_t n = fwrite(data, 1, size, fp);
    return fclose(fp) == 0 && n == size ? 0 : -1;
}

#endif
