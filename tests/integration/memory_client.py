"""memory_client.py — hostile memory loads for test_memory_budget.sh (issue 50).

  bomb    URL          gzip bodies that inflate to tens of MiB of JSON values in
                       members no route reads, and in parameters; each must be
                       answered (200 or 400), never a dropped connection
  stalled URL N MIB    N uploads announcing MIB MiB that send most of it and
                       stall; meanwhile an infer and the probes are answered;
                       prints the memory the server holds and its refusals
  slow    URL N ROWS   N clients that ask vocab_embed for big JSON answers and
                       never read them; then one more request, answered 200 or
                       503 with Retry-After; prints what the server holds
Every mode checks the server process (--pid) is alive at the end and prints
its peak RSS (VmHWM). Exit 1 on any failed check."""
import argparse, gzip, http.client, json, socket, struct, sys, time, urllib.parse

X = {"name": "x", "shape": [1, 8, 32], "datatype": "FP32", "data": [0.5] * 256}


def conn(url):
    u = urllib.parse.urlparse(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=60)


def metric(url, name):
    c = conn(url)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return line.rsplit(" ", 1)[1]
    return "?"


def vm(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) // 1024
    return -1


def post(url, path, body, headers):
    c = conn(url)
    c.request("POST", path, body=body, headers=headers)
    r = c.getresponse()
    return r.status, r.getheader("Retry-After"), r.read()


def bomb(a):
    bad = 0
    cases = [("unknown member", b'{"junk":[%s],"inputs":[%s]}'),
             ("input's unknown member", b'{"inputs":[{"junk":[%s],"name":"x","shape":[1,8,32],"datatype":"FP32",'
                                        b'"data":%s}]}'),
             ("parameters", b'{"parameters":{"p":[%s]},"inputs":[%s]}')]
    for mib in (24, 60):
        n = mib * (1 << 20) // 3
        for what, form in cases:
            filler = b",".join([b"{}"] * n)
            second = json.dumps(X).encode() if b"junk" in form[:10] or b"parameters" in form[:20] else \
                json.dumps(X["data"]).encode()
            body = form % (filler, second)
            z = gzip.compress(body, 6)
            t = time.time()
            try:
                st, _, ans = post(a.url, "/v2/models/mlp_sp_tp2/infer", z,
                                  {"Content-Encoding": "gzip", "Content-Type": "application/json"})
            except OSError as e:
                st, ans = 0, str(e).encode()
            ok = st in (200, 400) and (st == 200 or b"max_json_values" in ans)
            bad += not ok
            print("%s %d KB gzip -> %d MiB of {} in %s: %d in %.2f s%s" % (
                "ok  " if ok else "FAIL", len(z) // 1024, len(body) >> 20, what, st, time.time() - t,
                "" if st == 200 else " (" + ans[:120].decode(errors="replace") + ")"))
    return bad


def held_within_budget(a, what):
    """Prints what the server holds under load `what`; 1 when past its budget."""
    held = int(metric(a.url, "tpserve_memory_held_bytes"))
    limit = int(metric(a.url, "tpserve_memory_budget_bytes"))
    print("%s: server holds %d MiB of a %d MiB budget, RSS %d MiB, 503s %s" % (
        what, held >> 20, limit >> 20, vm(a.pid, "VmRSS"), metric(a.url, 'tpserve_memory_refusals_total{code="503"}')))
    return int(held > limit)


def given_back(a, socks):
    """Closes the load's sockets; 1 unless the server then holds nothing."""
    for s in socks:
        s.close()
    time.sleep(1)
    after = int(metric(a.url, "tpserve_memory_held_bytes"))
    print("%s closed: server holds %d bytes" % ("ok  " if after == 0 else "FAIL", after))
    return int(after != 0)


def stalled(a):
    n, size = a.n, a.mib << 20
    socks = []
    for _ in range(n):
        s = socket.create_connection((urllib.parse.urlparse(a.url).hostname, urllib.parse.urlparse(a.url).port))
        s.sendall(b"POST /v2/models/mlp_sp_tp2/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % size)
        socks.append(s)
    chunk = b" " * (1 << 20)
    for _ in range(a.mib - 8):  # all but 8 MiB of each, then stall
        for s in socks:
            s.sendall(chunk)
    time.sleep(1)
    over = held_within_budget(a, "%d uploads of %d MiB stalled 8 MiB short" % (n, a.mib))
    st, ra, ans = post(a.url, "/v2/models/mlp_sp_tp2/infer", json.dumps({"inputs": [X]}).encode(),
                       {"Content-Type": "application/json"})
    ok = (st == 200 and len(json.loads(ans)["outputs"][0]["data"]) == 256) or (st == 503 and ra)
    print("%s an infer meanwhile: %d" % ("ok  " if ok else "FAIL", st))
    return (not ok) + over + given_back(a, socks)


def slow(a):
    u = urllib.parse.urlparse(a.url)
    b = a.rows
    hdr = json.dumps({"inputs": [{"name": "ids", "shape": [b, 8], "datatype": "INT64",
                                  "parameters": {"binary_data_size": 64 * b}}]}).encode()
    req = (b"POST /v2/models/vocab_embed_tp2/infer HTTP/1.1\r\nHost: x\r\nInference-Header-Content-Length: %d\r\n"
           b"Content-Length: %d\r\n\r\n" % (len(hdr), len(hdr) + 64 * b)) + hdr + struct.pack("<%dq" % (8 * b), *([1] * 8 * b))
    socks = []
    for _ in range(a.n):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect((u.hostname, u.port))
        s.sendall(req)
        socks.append(s)
    time.sleep(2)
    over = held_within_budget(a, "%d slow readers of %d-row answers (%d KB sent each)" % (a.n, b, len(req) // 1024))
    st, ra, _ = post(a.url, "/v2/models/vocab_embed_tp2/infer", req.split(b"\r\n\r\n", 1)[1],
                     {"Inference-Header-Content-Length": str(len(hdr))})
    ok = st == 200 or (st == 503 and ra == "1")
    print("%s one more meanwhile: %d (Retry-After %s)" % ("ok  " if ok else "FAIL", st, ra))
    return (not ok) + over + given_back(a, socks)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["bomb", "stalled", "slow"])
    p.add_argument("url")
    p.add_argument("n", nargs="?", type=int, default=32)
    p.add_argument("size", nargs="?", type=int, default=48)
    p.add_argument("--pid", type=int, required=True)
    a = p.parse_args()
    a.mib = a.rows = a.size
    bad = {"bomb": bomb, "stalled": stalled, "slow": slow}[a.mode](a)
    try:
        print("server alive, peak RSS %d MiB" % vm(a.pid, "VmHWM"))
    except OSError:
        print("FAIL: the server is gone")
        bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
