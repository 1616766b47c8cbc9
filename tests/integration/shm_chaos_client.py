#!/usr/bin/env python3
"""shm_chaos_client.py — a hostile system shared memory client (issue 17):
stdlib + numpy only, loopback only, bounded in time.

  shm_chaos_client.py --url U --graphs D --graph G [--clients 4] [--seconds 4]
                      [--repeat 16]

One POSIX shm object holds the graph's example inputs and, after them, one
output slot per client thread. It is registered as region "chaos"; clients
then infer with inputs and outputs in the region while

  - a truncator shrinks the object to a random size (often inside the
    inputs or the outputs) and grows it back with the full contents, and
  - a re-registrar unregisters and registers the region again,

both in loops. The server must survive, and every answer must be a 200
whose outputs match the reference (checked when no truncation happened
between the request and the read of its outputs: a later truncation may
zero a slot the client has not read yet) or a 400 whose message names the
region. The client never maps the object (its own truncations would fault
it): it moves bytes with os.pread/os.pwrite on /dev/shm/<key>.
Exit 0 when every answer was one of those and each kind was seen.
"""
import argparse
import http.client
import json
import os
import random
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
import kserve_client as kc  # noqa: E402

REGION = "chaos"


class Chaos:
    def __init__(self, a):
        m = kc.manifest_entry(a.graphs, a.graph)
        self.a, self.rtol = a, m["rtol"]
        self.inputs = kc.load_tensors(a.graphs, m["inputs"], a.repeat)
        self.ref = kc.load_tensors(a.graphs, m["ref"], a.repeat)
        self.path = "/v2/models/%s/infer" % a.graph
        self.key = "/tp_chaos_%d" % os.getpid()
        blob, self.in_spans = b"", {}
        for name, (dt, arr) in self.inputs.items():
            raw = np.ascontiguousarray(arr).tobytes()
            self.in_spans[name] = (len(blob), len(raw))
            blob += raw
        self.out_bytes = sum(r.nbytes for _, r in self.ref.values())
        self.content = blob + bytes(self.out_bytes * a.clients)
        self.out_base = len(blob)
        self.fd = os.open("/dev/shm" + self.key, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.pwrite(self.fd, self.content, 0)
        # generation: bumped on every truncation, under mu with the restore
        self.mu, self.gen = threading.Lock(), 0
        self.stop = threading.Event()
        self.counts, self.notes = {}, []

    def tally(self, kind, note=None):
        with self.mu:
            self.counts[kind] = self.counts.get(kind, 0) + 1
            if note and len(self.notes) < 10:
                self.notes.append(note)

    def call(self, method, path, doc=None):
        host, port = kc.split_url(self.a.url)
        c = http.client.HTTPConnection(host, port, timeout=30)
        body = json.dumps(doc).encode() if doc is not None else None
        c.request(method, path, body, {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, data

    def register(self):
        return self.call("POST", "/v2/systemsharedmemory/region/%s/register" % REGION,
                         {"key": self.key, "offset": 0, "byte_size": len(self.content)})

    def request_doc(self, slot):
        ins = [{"name": n, "shape": list(a.shape), "datatype": dt,
                "parameters": {"shared_memory_region": REGION,
                               "shared_memory_offset": self.in_spans[n][0],
                               "shared_memory_byte_size": self.in_spans[n][1]}}
               for n, (dt, a) in self.inputs.items()]
        outs, off = [], self.out_base + slot * self.out_bytes
        for n, (_, r) in self.ref.items():
            outs.append({"name": n, "parameters": {"shared_memory_region": REGION,
                                                   "shared_memory_offset": off,
                                                   "shared_memory_byte_size": r.nbytes}})
            off += r.nbytes
        return {"inputs": ins, "outputs": outs}

    def outputs_correct(self, slot):
        off = self.out_base + slot * self.out_bytes
        for n, (dt, r) in self.ref.items():
            raw = os.pread(self.fd, r.nbytes, off)
            off += r.nbytes
            if len(raw) != r.nbytes:
                return False
            got = np.frombuffer(raw, dtype=kc.KSERVE_NP[dt])
            st = "BF16" if dt == "BF16" else "F32"
            err = compare.rel_err(compare.to_f64(st, got).reshape(r.shape),
                                  compare.to_f64(st, r))
            if not err <= self.rtol:
                return False
        return True

    def client(self, slot):
        doc = self.request_doc(slot)
        while not self.stop.is_set():
            with self.mu:
                gen = self.gen
            try:
                st, body = self.call("POST", self.path, doc)
            except (OSError, http.client.HTTPException) as e:
                self.tally("dropped", "connection failed: %s" % e)
                return
            text = body.decode(errors="replace")
            if st == 400 and ("region '%s'" % REGION) in text:
                self.tally("400 naming the region")
            elif st != 200:
                self.tally("other", "HTTP %s: %s" % (st, text[:300]))
            else:
                with self.mu:  # no truncation may run while the slot is read
                    if self.gen != gen:
                        kind = "200 (unverifiable: truncated meanwhile)"
                    elif self.outputs_correct(slot):
                        kind = "200 correct"
                    else:
                        kind = "200 WRONG"
                self.tally(kind, "wrong outputs in slot %d" % slot if "WRONG" in kind else None)

    def truncator(self):
        """Bursts of back-to-back truncations (the server's copies race with
        them), then quiet spells in which answers can be verified."""
        rng = random.Random(7)
        while not self.stop.is_set():
            burst_end = time.monotonic() + 0.03
            while time.monotonic() < burst_end:
                with self.mu:
                    self.gen += 1
                    os.ftruncate(self.fd, rng.randrange(0, len(self.content)))
                    # grown back by writing the contents: a reader sees the
                    # size grow only over bytes already written
                    os.pwrite(self.fd, self.content, 0)
            self.stop.wait(0.03)

    def reregistrar(self):
        try:
            while not self.stop.wait(0.05):
                self.call("POST", "/v2/systemsharedmemory/region/%s/unregister" % REGION)
                st, _ = self.register()
                if st != 200:  # refused while the object is truncated
                    self.tally("register refused (object truncated)")
                while st != 200 and not self.stop.is_set():
                    time.sleep(0.001)
                    st, _ = self.register()
        except (OSError, http.client.HTTPException) as e:
            self.tally("dropped", "re-registering: %s" % e)

    def run(self):
        st, body = self.register()
        if st != 200:
            print("FAIL: register: HTTP %s %s" % (st, body[:200]))
            return 1
        threads = [threading.Thread(target=self.client, args=(i,)) for i in range(self.a.clients)]
        threads += [threading.Thread(target=self.truncator), threading.Thread(target=self.reregistrar)]
        for t in threads:
            t.start()
        time.sleep(self.a.seconds)
        self.stop.set()
        for t in threads:
            t.join()
        try:
            self.call("POST", "/v2/systemsharedmemory/unregister")
        except (OSError, http.client.HTTPException) as e:
            self.tally("dropped", "unregistering: %s" % e)
        os.close(self.fd)
        os.unlink("/dev/shm" + self.key)
        for k in sorted(self.counts):
            print("  %-42s %d" % (k, self.counts[k]))
        for n in self.notes:
            print("  note: %s" % n)
        bad = sum(self.counts.get(k, 0) for k in ("other", "200 WRONG", "dropped"))
        seen = all(self.counts.get(k, 0) for k in ("200 correct", "400 naming the region"))
        if bad or not seen:
            print("FAIL: %d unexpected answers; correct and refused answers both seen: %s"
                  % (bad, seen))
            return 1
        return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--graphs", required=True)
    p.add_argument("--graph", required=True)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=4)
    p.add_argument("--repeat", type=int, default=16,
                   help="batch rows per request: bigger copies, wider races")
    return Chaos(p.parse_args()).run()


if __name__ == "__main__":
    sys.exit(main())
