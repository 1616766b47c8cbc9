/* json_cap.h — a bound on the memory jansson may allocate while it decodes
 * one client-sent document.
 *
 * jansson builds a node for every value: `{}` takes three bytes of text and
 * about 250 bytes of nodes, so a body of nested empty objects decoded
 * whole costs ~80x its size (a 63 MiB inflated body took the server past
 * a 2 GiB container limit). The request scan (json_tensor.h) skips what no
 * route reads and counts the values it leaves; this cap is what still
 * holds when the scan cannot follow a document (deeper than it tracks, or
 * malformed), and for every other route's JSON: while a thread is inside
 * tp_json_cap_begin/end, each jansson allocation draws from that thread's
 * allowance, and one past it fails as out of memory, which jansson reports
 * as a failed parse. Allocations outside a capped stretch are jansson's as
 * before. The hook is process-wide (json_set_alloc_funcs), so it is
 * installed once, before the server parses anything. */
#ifndef TP_JSON_CAP_H
#define TP_JSON_CAP_H

#include <stddef.h>

/* Bytes of jansson nodes allowed per JSON value the server allows: an
 * empty object (the largest node with its hash table) is ~250 bytes. */
#define TP_JSON_CAP_BYTES_PER_VALUE 256

/* Installs the hook (once; later calls only change the limit) and sets
 * the values a document may have: a capped stretch may allocate
 * max_values * TP_JSON_CAP_BYTES_PER_VALUE bytes, plus six times the
 * text's length: a string is read into jansson's token buffer, which
 * doubles as it grows (up to twice the string; the doublings' sum twice
 * that again, counted though the smaller ones are freed), then copied
 * out once more. What is live at once stays near three times. */
void tp_json_cap_set_values(int max_values);

/* The limit set (0: none set: capped stretches are unbounded). */
int tp_json_cap_values(void);

/* Starts a capped stretch on this thread for a document of text_len bytes. */
void tp_json_cap_begin(size_t text_len);

/* Ends it: 1 when an allocation was refused in it (the parse that failed
 * did so for the cap, not the text), else 0. */
int tp_json_cap_end(void);

/* The allowance of a document of text_len bytes, for messages. */
size_t tp_json_cap_bytes(size_t text_len);

#endif
