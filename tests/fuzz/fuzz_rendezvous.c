/* libFuzzer harness: the hello a joining rank sends the leader's
 * rendezvous socket (tp_rank_hello_check), as any local process that can
 * reach the socket may send it. The input: a byte for the group's world
 * size (1 + b % TP_GROUP_MAX_PROCESSES), eight bytes of which ranks have
 * joined (bit r: rank r is in), then the hello's bytes. A rank admitted
 * must be one the group has room for, named by a whole hello with the
 * magic; anything else must be refused with a terminated "error: ..."
 * line, the one sent back. A mismatch aborts (a finding). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rank_group.h"
#include "rank_procs.h"

#define HEAD 9

static void check(int ok)
{
    if (!ok)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < HEAD)
        return 0;
    int world = 1 + data[0] % TP_GROUP_MAX_PROCESSES;
    int32_t joined[TP_GROUP_MAX_PROCESSES];
    for (int r = 0; r < world; r++)
        joined[r] = r == 0 ? 100 : (data[1 + r % 8] >> (r / 8 % 8) & 1) ? 100 + r : -1;
    const uint8_t *hello = data + HEAD;
    size_t n = size - HEAD;
    char why[200];
    memset(why, 0x55, sizeof why);
    int rank = tp_rank_hello_check(hello, n, world, joined, why, sizeof why);
    if (rank) {
        uint32_t magic;
        int32_t r, w;
        check(n == TP_RANK_HELLO_BYTES);
        memcpy(&magic, hello, 4);
        memcpy(&r, hello + 4, 4);
        memcpy(&w, hello + 8, 4);
        check(magic == 0x74707267u && r == rank && w == world && rank >= 1 && rank < world && joined[rank] < 0);
    } else {
        check(memchr(why, '\0', sizeof why) && !strchr(why, '\n') && strncmp(why, "error: ", 7) == 0);
    }
    return 0;
}
