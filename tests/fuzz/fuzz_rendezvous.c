/* libFuzzer harness: the hello a joining rank sends the leader's
 * rendezvous socket (tp_rank_hello_check), as any local process that can
 * reach the socket may send it, and who may send one (tp_rank_uid_check).
 * The input: a byte for the group's world size (1 + b % TP_GROUP_MAX_PROCESSES;
 * its top bit: a rendezvous_uid of 1001 besides the leader's 1000), eight
 * bytes of which ranks have joined (bit r: rank r is in), then the hello's
 * bytes (magic, rank, world, pid, then the group secret's 64 hex digits).
 * A rank admitted must be one the group has room for, named by a whole
 * hello with the magic and the group's secret; anything else must be
 * refused with a terminated "error: ..." line, the one sent back. A uid
 * (the hello's pid field, taken as one) is admitted exactly when it is
 * the leader's or rendezvous_uid. A mismatch aborts (a finding). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rank_group.h"
#include "rank_procs.h"

#define HEAD 9

/* the group's secret; tests/unit/test_rank_group.c's group_secret */
static const char secret[] = "00112233445566778899aabbccddeeff0123456789abcdef0123456789abcdef";

static void check(int ok)
{
    if (!ok)
        abort();
}

static void check_refusal(const char *why, size_t cap)
{
    check(memchr(why, '\0', cap) && !strchr(why, '\n') && strncmp(why, "error: ", 7) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < HEAD)
        return 0;
    int world = 1 + data[0] % TP_GROUP_MAX_PROCESSES;
    int join_uid = data[0] & 0x80 ? 1001 : -1;
    int32_t joined[TP_GROUP_MAX_PROCESSES];
    for (int r = 0; r < world; r++)
        joined[r] = r == 0 ? 100 : (data[1 + r % 8] >> (r / 8 % 8) & 1) ? 100 + r : -1;
    const uint8_t *hello = data + HEAD;
    size_t n = size - HEAD;
    char why[200];
    memset(why, 0x55, sizeof why);
    int rank = tp_rank_hello_check(hello, n, world, joined, secret, why, sizeof why);
    if (rank) {
        uint32_t magic;
        int32_t r, w;
        check(n == TP_RANK_HELLO_BYTES);
        memcpy(&magic, hello, 4);
        memcpy(&r, hello + 4, 4);
        memcpy(&w, hello + 8, 4);
        check(magic == 0x74707267u && r == rank && w == world && rank >= 1 && rank < world && joined[rank] < 0);
        check(memcmp(hello + 16, secret, TP_RANK_SECRET_CHARS) == 0);
    } else {
        check_refusal(why, sizeof why);
    }
    if (n >= 16) {
        uint32_t uid;
        memcpy(&uid, hello + 12, 4);
        memset(why, 0x55, sizeof why);
        int ok = tp_rank_uid_check(uid, 1000, join_uid, why, sizeof why);
        check(ok == (uid == 1000 || (join_uid >= 0 && uid == (uint32_t)join_uid)));
        if (!ok)
            check_refusal(why, sizeof why);
    }
    return 0;
}
