#!/usr/bin/env python3
"""abuse_client.py — hostile and heavy clients for tpserve (issue 16), stdlib +
numpy only, loopback only; every mode is bounded in count and time.

  abuse_client.py storm --url U --pid P --graphs D --graph G [--conns 12]
      [--signals 20] [--within-ms 40]
      load (a fresh connection per request) then SIGTERM x signals within
      within-ms: every request that got a connection is answered (200 with
      the reference's values, or 503), refused connects are fine; the load
      ends when the server is gone.  The caller checks the exit code.
  abuse_client.py hold --url U [--probe-url U2] [--idle 1100] [--slowloris 1100]
      [--seconds 8] [--deadline-ms 0]
      holds idle and slowloris connections (one header byte per second)
      while probing GET /v2/health/ready on fresh connections every 0.25 s
      on each URL: every probe must answer 200 within 1 s.  With
      --deadline-ms the server must then close the slowloris connections
      within 1.5 x the deadline (trickling does not extend it).
  abuse_client.py poison --url U --graphs D --graph G [--clients 8] [--seconds 4]
      clients send valid requests (checked against the reference) while
      one client sends out-of-range embedding ids: every valid request is
      200 and correct, every bad one its own 400 naming only its own data.
  abuse_client.py deathwatch --url U --victim PID [--within-ms 100]
      SIGKILL a rank's process, then readiness must turn 503 within
      within-ms (probed every 5 ms).
  abuse_client.py soak --url U --pid P --graphs D --graph G [--seconds 30]
      [--conns 8]
      mixed valid (JSON, binary) and invalid requests, health and metrics;
      valid answers checked against the reference; RSS sampled at start and
      end; prints a table.  Exit 1 on any wrong answer or unexpected class.
"""
import argparse
import http.client
import os
import random
import select
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kserve_client as kc  # noqa: E402


def host_port(url):
    return kc.split_url(url)


class Reference:
    """A graph's example request (JSON and binary bodies) and its answer."""

    def __init__(self, graphs, graph):
        m = kc.manifest_entry(graphs, graph)
        self.graph, self.rtol = graph, m["rtol"]
        self.inputs = kc.load_tensors(graphs, m["inputs"], 1)
        self.ref = kc.load_tensors(graphs, m["ref"], 1)
        self.json_body, _ = kc.build_request(self.inputs)
        self.bin_body, self.bin_hl = kc.build_request(self.inputs, binary=True, binary_out=True)
        self.path = "/v2/models/%s/infer" % graph

    def correct(self, body, header_len):
        try:
            doc, outs = kc.parse_response(body, header_len)
        except (ValueError, KeyError, TypeError):
            return False
        return kc.check_outputs(doc, outs, self.ref, self.rtol, list(self.ref), None, say=lambda *_: None) == 0


def request(url, method, path, body=None, header_len=-1, timeout=30):
    """-> ("refused" | "dropped" | status, body, header_len) on a fresh connection."""
    host, port = host_port(url)
    try:
        s = socket.create_connection((host, port), timeout=timeout)
    except ConnectionRefusedError:
        return "refused", b"", -1
    except OSError:
        return "refused", b"", -1
    c = http.client.HTTPConnection(host, port, timeout=timeout)
    c.sock = s
    headers = {"Content-Type": "application/json"}
    if header_len >= 0:
        headers = {"Content-Type": "application/octet-stream",
                   "Inference-Header-Content-Length": str(header_len)}
    try:
        c.request(method, path, body, headers)
        r = c.getresponse()
        data = r.read()
        hl = r.getheader("Inference-Header-Content-Length")
        return r.status, data, int(hl) if hl else -1
    except (OSError, http.client.HTTPException):
        return "dropped", b"", -1
    finally:
        c.close()


class Tally:
    def __init__(self):
        self.mu = threading.Lock()
        self.counts = {}
        self.notes = []

    def add(self, key, note=None):
        with self.mu:
            self.counts[key] = self.counts.get(key, 0) + 1
            if note and len(self.notes) < 10:
                self.notes.append(note)


# ---- storm -----------------------------------------------------------------

def cmd_storm(a):
    ref = Reference(a.graphs, a.graph)
    t = Tally()
    stop = threading.Event()

    def client():
        while not stop.is_set():
            st, body, hl = request(a.url, "POST", ref.path, ref.bin_body, ref.bin_hl)
            if st == "refused":
                t.add("refused")
                return
            if st == 200:
                t.add("200" if ref.correct(body, hl) else "wrong answer")
            else:
                t.add(str(st), "%s: %r" % (st, body[:200]))

    th = [threading.Thread(target=client) for _ in range(a.conns)]
    for x in th:
        x.start()
    time.sleep(1.0)
    t0 = time.monotonic()
    for i in range(a.signals):
        try:
            os.kill(a.pid, signal.SIGTERM)
        except ProcessLookupError:
            break
        time.sleep(a.within_ms / 1000.0 / a.signals)
    sent_ms = (time.monotonic() - t0) * 1000
    deadline = time.monotonic() + 30
    for x in th:
        x.join(max(0.1, deadline - time.monotonic()))
    stop.set()
    for x in th:
        x.join()
    c = t.counts
    bad = {k: v for k, v in c.items() if k not in ("200", "503", "refused")}
    print("storm: %d SIGTERMs in %.0f ms; requests: %s" % (a.signals, sent_ms, dict(sorted(c.items()))))
    for n in t.notes:
        print("  ", n)
    return 1 if bad or not c.get("200") else 0


# ---- hold: idle + slowloris connections, readiness probes ----------------------

SLOW_HEAD = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\nX-Slow: "


def open_many(url, n):
    host, port = host_port(url)
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=10)
        s.setblocking(False)
        socks.append(s)
    return socks


def probe(url):
    t0 = time.monotonic()
    st, _, _ = request(url, "GET", "/v2/health/ready", timeout=5)
    return st, time.monotonic() - t0


def closed_by_peer(s):
    try:
        return s.recv(4096) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def cmd_hold(a):
    urls = [a.url] + ([a.probe_url] if a.probe_url else [])
    idle = open_many(a.url, a.idle)
    slow = open_many(a.url, a.slowloris)
    for s in slow:
        s.send(SLOW_HEAD)
    t_open = time.monotonic()
    print("hold: %d idle and %d slowloris connections open" % (len(idle), len(slow)))
    worst = {u: 0.0 for u in urls}
    fails = []
    n_probes = 0
    end = time.monotonic() + a.seconds
    next_byte = time.monotonic()
    while time.monotonic() < end:
        if time.monotonic() >= next_byte:  # one byte per connection per second
            for s in slow:
                try:
                    s.send(b"a")
                except OSError:
                    pass
            next_byte += 1.0
        for u in urls:
            st, dt = probe(u)
            n_probes += 1
            worst[u] = max(worst[u], dt)
            if st != 200 or dt > 1.0:
                fails.append("%s: %s after %.2f s" % (u, st, dt))
        time.sleep(0.25)
    alive = sum(not closed_by_peer(s) for s in slow)
    print("hold: %d probes, slowest per URL: %s; %d of %d slowloris still open after %.1f s" %
          (n_probes, ", ".join("%s %.3f s" % (u, w) for u, w in worst.items()), alive, len(slow),
           time.monotonic() - t_open))
    rc = 0
    if fails:
        print("FAIL probes: %s" % "; ".join(fails[:10]))
        rc = 1
    if a.deadline_ms:
        limit = t_open + 1.5 * a.deadline_ms / 1000.0
        while time.monotonic() < limit:
            for s in slow:
                try:
                    s.send(b"a")
                except OSError:
                    pass
            if all(closed_by_peer(s) for s in slow):
                break
            time.sleep(0.5)
        open_left = sum(not closed_by_peer(s) for s in slow)
        print("hold: %d slowloris connections still open %.1f s after they opened (deadline %d ms)" %
              (open_left, time.monotonic() - t_open, a.deadline_ms))
        rc = rc or (1 if open_left else 0)
    for s in idle + slow:
        s.close()
    return rc


# ---- poison ------------------------------------------------------------------

def cmd_poison(a):
    ref = Reference(a.graphs, a.graph)
    name, (dt, ids) = next(iter(ref.inputs.items()))
    vocab = int(ids.max()) + 1
    t = Tally()
    end = time.monotonic() + a.seconds

    def good():
        while time.monotonic() < end:
            st, body, hl = request(a.url, "POST", ref.path, ref.bin_body, ref.bin_hl)
            t.add("good 200" if st == 200 and ref.correct(body, hl) else "good FAILED",
                  None if st == 200 else "good: %s %r" % (st, body[:300]))

    def bad():
        rng = random.Random(1)
        while time.monotonic() < end:
            b = ids.copy()
            pos = rng.randrange(b.size)
            b.reshape(-1)[pos] = 1000000 + vocab
            body, _ = kc.build_request({name: (dt, b)})
            st, resp, _ = request(a.url, "POST", ref.path, body)
            text = resp.decode(errors="replace")
            own = st == 400 and ("element %d holds id %d" % (pos, 1000000 + vocab)) in text \
                and "batch" not in text
            t.add("bad 400 (own message)" if own else "bad OTHER", None if own else "bad: %s %s" % (st, text[:300]))

    th = [threading.Thread(target=good) for _ in range(a.clients)] + [threading.Thread(target=bad)]
    for x in th:
        x.start()
    for x in th:
        x.join()
    c = t.counts
    print("poison: %s" % dict(sorted(c.items())))
    for n in t.notes:
        print("  ", n)
    return 0 if c.get("good 200") and c.get("bad 400 (own message)") and not c.get("good FAILED") \
        and not c.get("bad OTHER") else 1


# ---- deathwatch ----------------------------------------------------------------

def cmd_deathwatch(a):
    """SIGKILL the victim (a rank's process), then probe readiness every 5 ms
    on a kept-alive connection: 503 must come within --within-ms."""
    host, port = host_port(a.url)
    c = http.client.HTTPConnection(host, port, timeout=5)
    c.request("GET", "/v2/health/ready")
    r = c.getresponse()
    r.read()
    if r.status != 200:
        print("deathwatch: not ready before the kill (%d)" % r.status)
        return 1
    t0 = time.monotonic()
    os.kill(a.victim, signal.SIGKILL)
    while time.monotonic() - t0 < 5:
        c.request("GET", "/v2/health/ready")
        r = c.getresponse()
        r.read()
        if r.status == 503:
            ms = (time.monotonic() - t0) * 1000
            print("deathwatch: readiness 503 %.1f ms after SIGKILL of pid %d" % (ms, a.victim))
            return 0 if ms <= a.within_ms else 1
        time.sleep(0.005)
    print("deathwatch: still ready 5 s after SIGKILL of pid %d" % a.victim)
    return 1


# ---- soak --------------------------------------------------------------------

def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def soak_kinds(ref):
    """(class, method, path, body, header_len, expected status) to pick from."""
    model = "/v2/models/%s" % ref.graph
    return [
        ("valid json", "POST", ref.path, ref.json_body, -1, 200),
        ("valid binary", "POST", ref.path, ref.bin_body, ref.bin_hl, 200),
        ("malformed json", "POST", ref.path, b'{"inputs": [', -1, 400),
        ("wrong shape", "POST", ref.path, b'{"inputs":[{"name":"%s","shape":[1],"datatype":"FP32","data":[1]}]}'
         % next(iter(ref.inputs)).encode(), -1, 400),
        ("bad binary size", "POST", ref.path, ref.bin_body[:-3], ref.bin_hl, 400),
        ("unknown model", "POST", "/v2/models/nope/infer", ref.json_body, -1, 404),
        ("wrong method", "GET", ref.path, None, -1, 405),
        ("health", "GET", "/v2/health/ready", None, -1, 200),
        ("metadata", "GET", model, None, -1, 200),
        ("metrics", "GET", "/metrics", None, -1, 200),
    ]


def cmd_soak(a):
    ref = Reference(a.graphs, a.graph)
    kinds = soak_kinds(ref)
    weights = [6, 6, 1, 1, 1, 1, 1, 1, 1, 1]
    t = Tally()
    rss0 = rss_kb(a.pid)
    end = time.monotonic() + a.seconds

    def client(seed):
        rng = random.Random(seed)
        while time.monotonic() < end:
            cls, method, path, body, hl, want = rng.choices(kinds, weights)[0]
            st, resp, rhl = request(a.url, method, path, body, hl)
            if st == want and (want != 200 or not cls.startswith("valid") or ref.correct(resp, rhl)):
                t.add((cls, "ok"))
            else:
                t.add((cls, "FAILED"), "%s: got %s, want %s: %r" % (cls, st, want, resp[:200]))

    th = [threading.Thread(target=client, args=(i,)) for i in range(a.conns)]
    t0 = time.monotonic()
    for x in th:
        x.start()
    for x in th:
        x.join()
    secs = time.monotonic() - t0
    rss1 = rss_kb(a.pid)
    print("| class | requests | as expected | failed |")
    print("| --- | ---: | ---: | ---: |")
    total = failed = 0
    for cls, *_ in kinds:
        ok, bad = t.counts.get((cls, "ok"), 0), t.counts.get((cls, "FAILED"), 0)
        total, failed = total + ok + bad, failed + bad
        print("| %s | %d | %d | %d |" % (cls, ok + bad, ok, bad))
    print("| **all** | %d | %d | %d |" % (total, total - failed, failed))
    print()
    print("| seconds | connections | requests/s | RSS start (MiB) | RSS end (MiB) | growth (MiB) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    print("| %.1f | %d | %.0f | %.1f | %.1f | %.1f |" % (secs, a.conns, total / secs, rss0 / 1024, rss1 / 1024,
                                                       (rss1 - rss0) / 1024))
    for n in t.notes:
        print("  ", n)
    return 1 if failed or not total else 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("storm", "hold", "poison", "soak", "deathwatch"):
        s = sub.add_parser(name)
        s.add_argument("--url", required=True)
        if name in ("storm", "poison", "soak"):
            s.add_argument("--graphs", required=True)
            s.add_argument("--graph", required=True)
        if name in ("storm", "soak"):
            s.add_argument("--pid", type=int, required=True)
    sp = sub.choices
    sp["storm"].add_argument("--conns", type=int, default=12)
    sp["storm"].add_argument("--signals", type=int, default=20)
    sp["storm"].add_argument("--within-ms", type=float, default=40)
    sp["hold"].add_argument("--probe-url")
    sp["hold"].add_argument("--idle", type=int, default=1100)
    sp["hold"].add_argument("--slowloris", type=int, default=1100)
    sp["hold"].add_argument("--seconds", type=float, default=8)
    sp["hold"].add_argument("--deadline-ms", type=int, default=0)
    sp["poison"].add_argument("--clients", type=int, default=8)
    sp["poison"].add_argument("--seconds", type=float, default=4)
    sp["soak"].add_argument("--seconds", type=float, default=30)
    sp["soak"].add_argument("--conns", type=int, default=8)
    sp["deathwatch"].add_argument("--victim", type=int, required=True)
    sp["deathwatch"].add_argument("--within-ms", type=float, default=100)
    a = p.parse_args()
    return {"storm": cmd_storm, "hold": cmd_hold, "poison": cmd_poison, "soak": cmd_soak,
            "deathwatch": cmd_deathwatch}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
