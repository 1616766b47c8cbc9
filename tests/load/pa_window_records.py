# pa_window_records.py — a gdb script that shows why perf_analyzer's long
# time windows run away (server/README.md at 27cb4dd, "perf_analyzer's stalled row").
#
# At each InferenceProfiler::ValidLatencyMeasurement call it reads the
# records perf_analyzer is about to sort into the window and prints: how many
# there are, how many ended inside the window, after it (completed while it
# copied them) and before it, and how many element moves the function's
# one-at-a-time vector::erase loop will make (each erase moves every record
# still behind it). Layout of the tritonclient 2.49 (r24.08) build, read
# from its disassembly: all_request_records_ at this+0xd8, RequestRecord
# 0x68 bytes (start_time_ at 0, response_timestamps_ at 8, ...,
# has_null_last_response_ at 0x60). Another build needs other offsets.
#
# usage: gdb -p $(pgrep -n -x perf_analyzer) --batch \
#            -ex 'source tests/load/pa_window_records.py' -ex continue
# (gdb stops perf_analyzer while it reads: the next window is longer.)
import struct

import gdb

RECORDS_OFFSET = 0xD8
RECORD_SIZE = 0x68
NULL_LAST_OFFSET = 0x60


def record_end(inferior, raw, i):
    """The end time perf_analyzer uses for record i, None if it has none."""
    _, ts_begin, ts_end = struct.unpack_from("<QQQ", raw, i * RECORD_SIZE)
    count = (ts_end - ts_begin) // 8
    last = count - 2 if raw[i * RECORD_SIZE + NULL_LAST_OFFSET] else count - 1
    if last < 0:
        return None
    return struct.unpack("<Q", bytes(inferior.read_memory(ts_begin + 8 * last, 8)))[0]


class WindowRecords(gdb.Breakpoint):
    def stop(self):
        inferior = gdb.selected_inferior()
        this = int(gdb.parse_and_eval("$rdi"))
        lo, hi = struct.unpack("<QQ", inferior.read_memory(int(gdb.parse_and_eval("$rsi")), 16))
        begin, end = struct.unpack("<QQ", inferior.read_memory(this + RECORDS_OFFSET, 16))
        n = (end - begin) // RECORD_SIZE
        raw = bytes(inferior.read_memory(begin, end - begin)) if n else b""
        erased = [False] * n
        after = before = 0
        last_end = hi
        for i in range(n):
            start = struct.unpack_from("<Q", raw, i * RECORD_SIZE)[0]
            t = record_end(inferior, raw, i)
            if t is None or (start <= t and lo <= t <= hi):
                erased[i] = True
            elif t > hi:
                after += 1
                last_end = max(last_end, t)
            else:
                before += 1
        moves = kept_behind = 0
        for i in range(n - 1, -1, -1):  # the erase loop runs back to front
            if erased[i]:
                moves += kept_behind
            else:
                kept_behind += 1
        gdb.write(
            "window %.3f s: records %d, in window %d, ended after it %d (the last %.0f ms after), "
            "before it %d; erase loop element moves %d\n"
            % ((hi - lo) / 1e9, n, sum(erased), after, (last_end - hi) / 1e6, before, moves)
        )
        gdb.flush()
        return False


WindowRecords("triton::perfanalyzer::InferenceProfiler::ValidLatencyMeasurement")
