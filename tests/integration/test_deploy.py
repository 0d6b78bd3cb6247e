#!/usr/bin/python3
"""test_deploy.py - what of deploy/ can be checked without a container engine.

No Docker daemon or Kubernetes cluster runs here, so this test checks the parts that decide
whether the images, the compose file and the manifests work, against the real binary:

  Dockerfile   stages, COPY sources exist and survive .dockerignore, runtime stages are
               non-root with an entrypoint (and a healthcheck where a service runs)
  compose      plain YAML (no merge tags); build targets exist in the Dockerfile; CPU by
               default, the GPU override; volumes; the PID namespace holder that mfstream and
               reader join; every MFSTREAM_* variable is a key the binary accepts; the
               producer's command runs (against the embedded broker)
  k8s          the kustomization's files exist; kinds; Recreate, one replica, shared PID
               namespace, non-root, GPU limit; probes, Service and Prometheus annotations on
               the port the entrypoint gives metrics.listen; ConfigMap file and env parse with
               the binary; `kubectl kustomize` renders it (where kubectl exists)
  entrypoint   container defaults apply only where nothing else set the key; env, file and
               flags win; bad variables fail with exit 2; other commands pass through; exec:
               SIGTERM reaches mfstream, which publishes its final snapshot; the reader example
               reads that snapshot; the healthcheck script against a stub server
  scripts      runtime-deps.sh lists the packages the binary needs; shellcheck when installed

Env: MFS_BIN (mfstream), MFS_SRC_DIR (repository root). Exit 77 only when python3-yaml is
missing (Debian package python3-yaml).
"""

import http.server
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

try:
    import yaml
except ImportError:
    print("SKIP: python3-yaml is not installed (apt-get install python3-yaml)")
    sys.exit(77)

SRC = os.path.abspath(os.environ.get("MFS_SRC_DIR", os.getcwd()))
BIN = os.path.abspath(os.environ.get("MFS_BIN", os.path.join(SRC, "build", "mfstream")))
DEPLOY = os.path.join(SRC, "deploy")
K8S = os.path.join(DEPLOY, "k8s")
ENTRY = os.path.join(DEPLOY, "entrypoint.sh")

sys.path.insert(0, os.path.join(SRC, "tests"))
from testhelp import check, report, run, seconds, spawn, stop  # noqa: E402


def base_env(**extra):
    """A clean environment: no MFSTREAM_* from the caller, the binary as MFS_BIN."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MFSTREAM_")}
    env["MFS_BIN"] = BIN
    env.update(extra)
    return env


def conf_of(text):
    out = {}
    for line in text.splitlines():
        if " = " in line or line.endswith(" ="):
            k, _, v = line.partition(" =")
            out[k] = v[1:] if v.startswith(" ") else v
    return out


# ---- YAML --------------------------------------------------------------------------------
def load_yaml(path, many=False):
    """Plain YAML: the compose files use no merge tags (!reset, !override), which Docker Compose
    < 2.24 and podman-compose reject, so a SafeLoader must read every file here."""
    with open(path) as f:
        if many:
            return [d for d in yaml.safe_load_all(f) if d is not None]
        return yaml.safe_load(f)


# ---- the binary's view of the configuration ------------------------------------------------
BUILTIN = conf_of(run([BIN, "config"], env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}).stdout)
HAVE_METRICS = "metrics.listen" in BUILTIN


def entrypoint_default(var):
    """The default the entrypoint gives: ${VAR:-value} in deploy/entrypoint.sh."""
    m = re.search(r"\$\{%s:-([^}]*)\}" % re.escape(var), open(ENTRY).read())
    return m.group(1) if m else None


METRICS_LISTEN = entrypoint_default("MFS_DEFAULT_METRICS_LISTEN")
SNAPSHOT_DEFAULT = entrypoint_default("MFS_DEFAULT_SNAPSHOT_DIR")
METRICS_PORT = int(METRICS_LISTEN.rsplit(":", 1)[1]) if METRICS_LISTEN else None


# ---- .dockerignore -------------------------------------------------------------------------
def dockerignore_patterns():
    pats = []
    for line in open(os.path.join(SRC, ".dockerignore")):
        line = line.strip()
        if line and not line.startswith("#"):
            pats.append(line)
    return pats


def _pattern_re(pat):
    """A .dockerignore pattern as a regex (Go filepath.Match plus Docker's **)."""
    out, i = "", 0
    while i < len(pat):
        if pat.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pat.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pat[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pat[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pat[i]), i + 1
    return re.compile(out + r"\Z")


def ignored(relpath, pats):
    """Docker's rule: the last matching pattern decides (!pattern re-includes); a pattern that
    matches a directory excludes what is under it."""
    parts = relpath.strip("/").split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    result = False
    for p in pats:
        neg = p.startswith("!")
        rx = _pattern_re((p[1:] if neg else p).strip("/"))
        if any(rx.match(pre) for pre in prefixes):
            result = not neg
    return result


# ---- Dockerfile ----------------------------------------------------------------------------
def dockerfile_stages():
    """[(name, base image, [instruction lines])] with line continuations joined."""
    text = open(os.path.join(DEPLOY, "Dockerfile")).read()
    text = re.sub(r"\\\n", " ", text)
    args, stages = {}, []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = re.match(r"(?i)ARG\s+(\w+)=(\S+)", s)
        if m and not stages:
            args[m.group(1)] = m.group(2).strip('"')
        m = re.match(r"(?i)FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", s)
        if m:
            image = re.sub(r"\$\{(\w+)\}", lambda x: args.get(x.group(1), x.group(0)), m.group(1))
            stages.append([m.group(2) or "", image, []])
            continue
        if stages:
            stages[-1][2].append(s)
    return [tuple(x) for x in stages]


def project_version():
    m = re.search(r"project\(mfstream\s+VERSION\s+([0-9.]+)", open(os.path.join(SRC, "CMakeLists.txt")).read())
    return m.group(1) if m else None


def dockerfile_args():
    text = open(os.path.join(DEPLOY, "Dockerfile")).read()
    return dict(re.findall(r"(?im)^ARG\s+(\w+)=(\S*)", text))


def stage_labels(lines):
    """LABEL key="value" pairs of one stage's lines (continuations joined)."""
    out = {}
    for ln in lines:
        if ln.upper().startswith("LABEL "):
            out.update(re.findall(r'([\w.-]+)="([^"]*)"', ln))
    return out


def test_dockerfile():
    stages = dockerfile_stages()
    names = [s[0] for s in stages]
    for want in ("build-cpu", "build-gpu", "cpu", "reader", "gpu"):
        check(want in names, "Dockerfile has stage %s (has %s)" % (want, names))
    by = {s[0]: s for s in stages}
    pats = dockerignore_patterns()
    for name, image, lines in stages:
        for ln in lines:
            m = re.match(r"(?i)COPY\s+(.*)", ln)
            if not m:
                continue
            words = m.group(1).split()
            opts = [w for w in words if w.startswith("--")]
            paths = [w for w in words if not w.startswith("--")]
            frm = [o.split("=", 1)[1] for o in opts if o.startswith("--from=")]
            if frm:
                check(frm[0] in names[:names.index(name)], "%s: COPY --from=%s names an earlier stage" % (name, frm[0]))
                continue
            for src in paths[:-1]:
                full = os.path.join(SRC, src)
                check(os.path.exists(full), "%s: COPY source %s exists" % (name, src))
                if src != ".":
                    check(not ignored(src, pats), "%s: COPY source %s is not excluded by .dockerignore" % (name, src))
    check(by["build-gpu"][1].startswith("nvidia/cuda:") and "-devel-" in by["build-gpu"][1],
          "build-gpu is FROM a CUDA devel image (%s)" % by["build-gpu"][1])
    check(re.match(r"nvidia/cuda:\S+-(base|runtime)-", by["gpu"][1]) is not None,
          "gpu is FROM a CUDA base/runtime image (%s)" % by["gpu"][1])
    check(by["cpu"][1].startswith("debian:") and by["cpu"][1].endswith("-slim"), "cpu is FROM debian slim")
    cuda = lambda image: re.match(r"nvidia/cuda:([0-9.]+)-", image).group(1)
    check(cuda(by["build-gpu"][1]) == cuda(by["gpu"][1]), "gpu runtime and build images have the same CUDA version")
    for name in ("cpu", "reader", "gpu"):
        lines = by[name][2]
        users = [ln.split(None, 1)[1] for ln in lines if ln.upper().startswith("USER ")]
        if name == "reader":  # inherits; its last USER must still be non-root
            check(users and users[-1] not in ("root", "0", "0:0"), "reader ends as a non-root USER")
            continue
        check(users and users[-1].split(":")[0] not in ("root", "0"), "%s runs as a non-root USER (%s)" % (name, users))
        check(any(ln.upper().startswith("ENTRYPOINT") and "mfs-entrypoint" in ln for ln in lines),
              "%s has ENTRYPOINT mfs-entrypoint" % name)
        hc = [ln for ln in lines if ln.upper().startswith("HEALTHCHECK")]
        check(hc and "mfs-healthcheck" in hc[-1], "%s has a HEALTHCHECK running mfs-healthcheck" % name)
        check(any(ln.upper().startswith("EXPOSE") and str(METRICS_PORT) in ln for ln in lines),
              "%s exposes the metrics port %s" % (name, METRICS_PORT))
    # OCI labels: every runtime image says what it is, which version and commit, and its base;
    # the version is the project's (so the k8s tags, which carry it, name what was built)
    oci = "org.opencontainers.image."
    check(dockerfile_args().get("MFS_VERSION") == project_version(),
          "Dockerfile ARG MFS_VERSION=%s is CMakeLists.txt's version %s"
          % (dockerfile_args().get("MFS_VERSION"), project_version()))
    for name in ("cpu", "gpu"):
        labels = stage_labels(by[name][2])
        for key in ("title", "description", "version", "revision", "created", "base.name"):
            check(oci + key in labels, "%s image has the label %s%s" % (name, oci, key))
        check(labels.get(oci + "version") == "${MFS_VERSION}", "%s: version label from ARG MFS_VERSION" % name)
        base = re.sub(r"\$\{(\w+)\}", lambda x: dockerfile_args().get(x.group(1), x.group(0)),
                      labels.get(oci + "base.name", ""))
        check(base.endswith("/" + by[name][1]), "%s: base.name %s names its FROM image %s" % (name, base, by[name][1]))
        check("ARG MFS_VERSION" in by[name][2], "%s re-declares ARG MFS_VERSION (stage scope)" % name)
    check(stage_labels(by["reader"][2]).get(oci + "title") == "mfstream-reader", "reader has a title of its own")
    # every script a RUN executes from /tmp or /src/deploy was copied or is in the source tree
    for name, _, lines in stages:
        copied = " ".join(ln for ln in lines if ln.upper().startswith("COPY"))
        for ln in lines:
            for script in re.findall(r"sh (/\S+\.sh)", ln):
                if script.startswith("/src/"):
                    check(os.path.exists(os.path.join(SRC, script[5:])), "%s: %s exists" % (name, script))
                else:
                    check(script in copied, "%s: %s is copied before it runs" % (name, script))
    # what CMake reads must be in the context
    cm = open(os.path.join(SRC, "CMakeLists.txt")).read()
    needed = {"CMakeLists.txt", "cmake"}
    needed |= {p.split("/")[0] for p in re.findall(r"\b([a-z_]+)/[\w*./]*\.(?:c|cu|h)\b", cm)}
    needed |= set(re.findall(r"add_subdirectory\((\w+)\)", cm)) - {"tests"}
    for d in sorted(needed):
        check(os.path.exists(os.path.join(SRC, d)), "CMake input %s exists" % d)
        check(not ignored(d, pats), ".dockerignore keeps CMake input %s in the context" % d)
    for d in ("build", "build-deploy", ".git", ".data", "snap/data.mdb"):
        check(ignored(d, pats), ".dockerignore excludes %s" % d)


# ---- compose -------------------------------------------------------------------------------
def env_dict(service):
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {k: str(v) for k, v in env.items()}


def merge_service(base, over):
    """Compose's merge of an override file's service into the base one (mappings merge, other
    values replace): enough for what compose.gpu.yaml sets."""
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = merge_service(out[k], v)
        else:
            out[k] = v
    return out


def test_compose():
    c = load_yaml(os.path.join(DEPLOY, "compose.yaml"))
    gpu = load_yaml(os.path.join(DEPLOY, "compose.gpu.yaml"))
    check(not os.path.exists(os.path.join(DEPLOY, "compose.cpu.yaml")), "no compose.cpu.yaml: CPU is the default")
    services = c["services"]
    names = {s[0] for s in dockerfile_stages()}
    for want in ("kafka", "kafka-init", "mfstream", "producer", "reader"):
        check(want in services, "compose has service %s" % want)
    declared = set((c.get("volumes") or {}).keys())
    for name, s in services.items():
        b = s.get("build")
        if b:
            ctx = os.path.normpath(os.path.join(DEPLOY, b.get("context", ".")))
            check(os.path.isfile(os.path.join(ctx, b.get("dockerfile", "Dockerfile"))),
                  "%s: build context + dockerfile exist" % name)
            check(b.get("target") in names, "%s: build target %s is a Dockerfile stage" % (name, b.get("target")))
        for v in s.get("volumes") or []:
            src = v.split(":")[0] if isinstance(v, str) else v.get("source")
            if src.startswith((".", "/")):
                check(os.path.exists(os.path.join(DEPLOY, src)), "%s: bind source %s exists" % (name, src))
            else:
                check(src in declared, "%s: volume %s is declared" % (name, src))
        dep = s.get("depends_on") or []
        for d in (dep if isinstance(dep, list) else dep.keys()):
            check(d in services, "%s depends on existing service %s" % (name, d))
    # CPU by default: no GPU in compose.yaml
    m = services["mfstream"]
    check(m["build"]["target"] == "cpu" and m.get("image") == "mfstream:cpu", "mfstream builds and runs the cpu target")
    check(env_dict(m).get("MFSTREAM_ENGINE_KIND") == "cpu", "mfstream selects the CPU engine")
    check("deploy" not in m, "compose.yaml reserves no GPU (compose.gpu.yaml does)")
    check(m.get("stop_grace_period"), "mfstream has a stop grace period for the final snapshot")
    # the GPU override only adds and replaces keys
    check(set(gpu.get("services", {})) == {"mfstream"}, "compose.gpu.yaml changes only mfstream")
    gm = merge_service(m, gpu["services"]["mfstream"])
    check(gm["build"]["target"] == "gpu" and gm.get("image") == "mfstream:gpu", "compose.gpu builds and runs the gpu target")
    check(gm["build"].get("context") == m["build"]["context"], "compose.gpu keeps the build context")
    check(env_dict(gm).get("MFSTREAM_ENGINE_KIND") == "cuda", "compose.gpu selects the CUDA engine")
    devs = gm.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])
    check(any(d.get("driver") == "nvidia" and "gpu" in d.get("capabilities", []) for d in devs),
          "compose.gpu reserves an NVIDIA GPU")
    # one PID namespace for writer and reader (LMDB tracks readers by PID), held by a service of
    # its own so that a restart of mfstream does not SIGKILL the reader
    r = services["reader"]
    pid = m.get("pid", "")
    holder = pid[len("service:"):] if pid.startswith("service:") else None
    check(holder and holder in services and holder not in ("mfstream", "reader"),
          "mfstream joins a PID namespace holder service (pid: %r)" % pid)
    check(r.get("pid") == pid, "reader joins the same PID namespace as mfstream (%r)" % r.get("pid"))
    if holder in services:
        h = services[holder]
        cmd = " ".join(h.get("command") or [])
        check(cmd.startswith("bash -c") and "trap 'exit 0' TERM" in cmd and "wait" in cmd,
              "%s is a pause: PID 1 that reaps (bash waits) and exits on SIGTERM: %s" % (holder, cmd))
        check(not h.get("init"), "%s has no init: (podman refuses --init in a pod's PID namespace)" % holder)
        check(h.get("restart") == "unless-stopped", "%s comes back with the stack" % holder)
        check(h.get("healthcheck", {}).get("test") == ["NONE"],
              "%s has no healthcheck (test NONE: podman-compose ignores disable)" % holder)
        check(not h.get("volumes") and not h.get("ports") and "pid" not in h, "%s holds nothing else" % holder)
        check(h.get("build", {}).get("target") in names, "%s's image is one the stack builds" % holder)
        for name, s in (("mfstream", m), ("reader", r)):
            dep = s.get("depends_on") or []
            check(holder in (dep if isinstance(dep, list) else dep.keys()), "%s depends on %s" % (name, holder))
    check(not m.get("init"), "mfstream has no init of its own (PID 1 is the holder's)")
    vol_of = lambda s: {v.split(":")[0]: v.split(":")[1] for v in s.get("volumes", [])}
    shared = set(vol_of(r)) & set(vol_of(m))
    check(shared, "reader and mfstream share a volume")
    for v in shared:
        check(vol_of(r)[v] == vol_of(m)[v], "shared volume %s is mounted at the same path" % v)
        check(not any(x.startswith(v + ":") and x.endswith(":ro") for x in r["volumes"]),
              "reader mounts %s read-write (LMDB lock file)" % v)
    check(any("/var/lib/mfstream" == p for p in vol_of(m).values()), "mfstream's volume is /var/lib/mfstream")
    check(services["producer"].get("healthcheck", {}).get("disable") is True,
          "producer disables the image healthcheck (it has no metrics endpoint)")
    # kafka-init waits for the broker itself (podman-compose ignores depends_on conditions)
    init_cmd = " ".join(services["kafka-init"]["command"])
    check("ratings" in init_cmd, "kafka-init creates the ratings topic")
    check("until " in init_cmd and "kafka-broker-api-versions.sh" in init_cmd, "kafka-init waits for the broker")
    # every MFSTREAM_* variable is a key the binary accepts, with the value it shows
    for name, s in list(services.items()) + [("mfstream (gpu)", gm)]:
        env = {k: v for k, v in env_dict(s).items() if k.startswith("MFSTREAM_")}
        if not env:
            continue
        p = run([BIN, "config"], env=base_env(**env))
        check(p.returncode == 0, "%s: the binary accepts its MFSTREAM_* environment: %s" % (name, p.stderr.strip()))
        got = conf_of(p.stdout)
        for k, v in env.items():
            key = k[len("MFSTREAM_"):].lower()
            if key.startswith("kafka_"):
                check(got.get("kafka." + key[6:].replace("_", ".")) == v, "%s: %s reaches kafka.*" % (name, k))
    # the test-only Kafka 2.4 override (tests/deploy) replaces the Kafka services and nothing else
    t = load_yaml(os.path.join(SRC, "tests", "deploy", "compose.kafka24.yaml"))
    check(set(t.get("services", {})) == {"kafka", "kafka-init"}, "compose.kafka24.yaml touches only kafka and kafka-init")
    # an override must not set a list the base file has: Docker Compose replaces command and
    # entrypoint, podman-compose 1.0.3 appends to them (and to every other list)
    for oname, over in (("compose.gpu.yaml", gpu), ("compose.kafka24.yaml", t)):
        for sname, so in over.get("services", {}).items():
            base = services.get(sname, {})
            for k, v in so.items():
                check(not (isinstance(v, list) and isinstance(base.get(k), list)),
                      "%s: %s.%s is a list in compose.yaml too (podman-compose would append)" % (oname, sname, k))
                check(k not in base or type(base[k]) is type(v),
                      "%s: %s.%s has the type of compose.yaml's (podman-compose refuses to merge others)"
                      % (oname, sname, k))
    return c


def test_producer_command(c):
    """Run the compose producer's command, with the embedded broker instead of kafka:9092 and a
    smaller stream, through the entrypoint: the flags it uses must exist."""
    cmd = [str(x) for x in c["services"]["producer"]["command"]]
    check(cmd[0] == "produce" and "--synthetic" in cmd, "producer runs produce --synthetic")
    args = []
    i = 0
    while i < len(cmd):
        a = cmd[i]
        if a == "--brokers":
            args.append("--embedded-broker")
            i += 2
            continue
        if a in ("--gen.ratings", "--rate"):
            args += [a, "2000" if a == "--gen.ratings" else "0"]
            i += 2
            continue
        args.append(a)
        i += 1
    p = run(["sh", ENTRY] + args, env=base_env(MFS_DEFAULT_SNAPSHOT_DIR="/nonexistent"), timeout=120)
    check(p.returncode == 0, "producer command runs (rc %d): %s" % (p.returncode, p.stderr[-400:]))
    check("events=2000 " in p.stdout, "producer delivered the 2000 events: %s" % p.stdout.strip()[-200:])


# ---- k8s -----------------------------------------------------------------------------------
def test_k8s():
    kz = load_yaml(os.path.join(K8S, "kustomization.yaml"))
    check("namespace" not in kz, "kustomization sets no namespace")
    files = list(kz.get("resources", []))
    for g in kz.get("configMapGenerator", []):
        files += [f.split("=", 1)[-1] for f in g.get("files", [])] + list(g.get("envs", []))
    for f in files:
        check(os.path.isfile(os.path.join(K8S, f)), "kustomization file %s exists" % f)
    docs = []
    for f in kz.get("resources", []):
        docs += load_yaml(os.path.join(K8S, f), many=True)
    kinds = {d["kind"]: d for d in docs}
    for k in ("Deployment", "PersistentVolumeClaim", "Service"):
        check(k in kinds, "k8s has a %s" % k)
    for d in docs:
        check("namespace" not in d.get("metadata", {}), "%s %s has no namespace" % (d["kind"], d["metadata"]["name"]))
    dep, pvc, svc = kinds["Deployment"], kinds["PersistentVolumeClaim"], kinds["Service"]
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    check(spec.get("replicas") == 1, "one replica (one writer per LMDB directory)")
    check(spec.get("strategy", {}).get("type") == "Recreate", "strategy Recreate")
    check(pod.get("shareProcessNamespace") is True, "shareProcessNamespace: true")
    sc = pod.get("securityContext", {})
    check(sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) != 0, "pod runs as non-root")
    check(pod.get("terminationGracePeriodSeconds", 30) >= 30, "grace period leaves time for the final snapshot")
    cons = {x["name"]: x for x in pod["containers"]}
    check(set(cons) == {"mfstream", "reader"}, "containers mfstream and reader")
    w, r = cons["mfstream"], cons["reader"]
    # images by an explicit version tag (the project's), never a moving one like gpu or latest
    for c in (w, r):
        image = c["image"]
        tag = image.split("@")[0].rpartition(":")[2] if ":" in image.split("@")[0].rpartition("/")[2] else ""
        check(re.match(re.escape(project_version() or "?") + r"-\w+$", tag) is not None,
              "%s: image %s has the explicit version tag %s-..." % (c["name"], image, project_version()))
    check(str(w["resources"]["limits"].get("nvidia.com/gpu")) == "1", "mfstream limits nvidia.com/gpu: 1")
    ports = {p["name"]: p["containerPort"] for p in w.get("ports", [])}
    check(ports.get("metrics") == METRICS_PORT, "container port metrics = %s (entrypoint's metrics.listen)" % METRICS_PORT)
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"), ("startupProbe", "/healthz")):
        g = w.get(probe, {}).get("httpGet", {})
        check(g.get("path") == path, "%s GETs %s" % (probe, path))
        port = g.get("port")
        check(ports.get(port, port) == METRICS_PORT, "%s uses the metrics port" % probe)
    for c in (w, r):
        csc = c.get("securityContext", {})
        check(csc.get("allowPrivilegeEscalation") is False, "%s: no privilege escalation" % c["name"])
        check(csc.get("runAsUser", sc.get("runAsUser")) == sc.get("runAsUser"),
              "%s runs as the pod's uid (lock.mdb is 0644)" % c["name"])
    # volumes: the PVC at the same path in both, read-write in the reader
    vols = {v["name"]: v for v in pod["volumes"]}
    claim = [n for n, v in vols.items() if "persistentVolumeClaim" in v]
    check(claim and vols[claim[0]]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"],
          "the Deployment mounts the PVC %s" % pvc["metadata"]["name"])
    check("ReadWriteOnce" in pvc["spec"]["accessModes"], "PVC is ReadWriteOnce")
    mounts = lambda c: {m["name"]: m for m in c.get("volumeMounts", [])}
    wm, rm = mounts(w), mounts(r)
    check(claim[0] in wm and claim[0] in rm and wm[claim[0]]["mountPath"] == rm[claim[0]]["mountPath"],
          "writer and reader mount the snapshots at the same path")
    check(not rm.get(claim[0], {}).get("readOnly", False), "reader mounts the snapshots read-write (lock.mdb)")
    snap_mount = wm[claim[0]]["mountPath"]
    # env: the ConfigMap env and the config file
    gens = {g["name"]: g for g in kz["configMapGenerator"]}
    env_refs = [e["configMapRef"]["name"] for e in w.get("envFrom", []) if "configMapRef" in e]
    check(env_refs and env_refs[0] in gens, "mfstream takes envFrom a generated ConfigMap")
    envfile = os.path.join(K8S, gens[env_refs[0]]["envs"][0])
    env = {}
    for line in open(envfile):
        line = line.strip()
        if line and not line.startswith("#"):
            k, _, v = line.partition("=")
            env[k] = v
    conf_path = env.get("MFSTREAM_CONFIG", "")
    cfg_vol = [n for n, v in vols.items() if "configMap" in v]
    check(cfg_vol and vols[cfg_vol[0]]["configMap"]["name"] in gens, "a volume holds the generated config ConfigMap")
    cfg_gen = gens[vols[cfg_vol[0]]["configMap"]["name"]]
    check(wm.get(cfg_vol[0], {}).get("mountPath") == os.path.dirname(conf_path),
          "the config ConfigMap is mounted where MFSTREAM_CONFIG points (%s)" % conf_path)
    conf_file = cfg_gen["files"][0].split("=", 1)[-1]
    check(os.path.basename(conf_path) == os.path.basename(conf_file), "MFSTREAM_CONFIG names the ConfigMap's file")
    local = dict(env, MFSTREAM_CONFIG=os.path.join(K8S, conf_file))
    p = run([BIN, "config"], env=base_env(**local))
    check(p.returncode == 0, "the binary loads the ConfigMap file and env: %s" % p.stderr.strip())
    got = conf_of(p.stdout)
    check(got.get("snapshot.dir", "").startswith(snap_mount + "/"), "snapshot.dir is on the PVC (%s)" % got.get("snapshot.dir"))
    check(got.get("engine.kind") == "cuda", "the GPU deployment asks for the CUDA engine")
    check(got.get("serve.topics"), "serve.topics is set")
    check(got.get("kafka.bootstrap.servers"), "kafka.bootstrap.servers is set")
    check(got.get("kafka.group.instance.id"), "static membership (kafka.group.instance.id) is set")
    # Service and Prometheus
    labels = spec["template"]["metadata"]["labels"]
    check(all(labels.get(k) == v for k, v in svc["spec"]["selector"].items()), "Service selects the pod")
    sp = svc["spec"]["ports"][0]
    check(sp["targetPort"] in ports or sp["targetPort"] == METRICS_PORT, "Service targets the metrics port")
    ann = svc["metadata"].get("annotations", {})
    check(ann.get("prometheus.io/scrape") == "true", "Service has prometheus.io/scrape")
    check(ann.get("prometheus.io/port") == str(METRICS_PORT), "prometheus.io/port is %s" % METRICS_PORT)
    check(ann.get("prometheus.io/path") == "/metrics", "prometheus.io/path is /metrics")
    # the rendered output, where kubectl is at hand (kustomize is built in)
    kubectl = shutil.which("kubectl")
    if not kubectl:
        print("note: kubectl not found; kustomize rendering not checked")
        return
    p = run([kubectl, "kustomize", K8S], timeout=120)
    if p.returncode != 0 and "kustomize" in p.stderr and "unknown command" in p.stderr:
        print("note: this kubectl has no kustomize; rendering not checked")
        return
    check(p.returncode == 0, "kubectl kustomize renders deploy/k8s: %s" % p.stderr[-400:])
    out = [d for d in yaml.safe_load_all(p.stdout) if d]
    cms = {d["metadata"]["name"] for d in out if d["kind"] == "ConfigMap"}
    rdep = [d for d in out if d["kind"] == "Deployment"][0]
    rpod = rdep["spec"]["template"]["spec"]
    refs = {e["configMapRef"]["name"] for c in rpod["containers"] for e in c.get("envFrom", []) if "configMapRef" in e}
    refs |= {v["configMap"]["name"] for v in rpod["volumes"] if "configMap" in v}
    check(refs and refs <= cms, "rendered Deployment references the generated ConfigMaps (%s in %s)" % (refs, cms))
    check(all("namespace" not in d["metadata"] for d in out), "rendered output is namespace-agnostic")


# ---- entrypoint ----------------------------------------------------------------------------
def test_entrypoint(tmp):
    snapdef = os.path.join(tmp, "default-snap")
    env = base_env(MFS_DEFAULT_SNAPSHOT_DIR=snapdef)
    p = run(["sh", ENTRY, "config"], env=env)
    check(p.returncode == 0, "entrypoint config runs: %s" % p.stderr)
    got = conf_of(p.stdout)
    check(got.get("snapshot.dir") == snapdef, "container default snapshot.dir applies (%s)" % got.get("snapshot.dir"))
    check('mod=entrypoint msg="container default" key=snapshot.dir' in p.stderr, "the default is logged")
    check(SNAPSHOT_DEFAULT == "/var/lib/mfstream/snap", "the image default is the volume /var/lib/mfstream/snap")
    if HAVE_METRICS:
        check(got.get("metrics.listen") == METRICS_LISTEN, "container default metrics.listen = %s" % METRICS_LISTEN)
    else:
        check("metrics.listen" not in got, "no metrics.listen forced on a binary without it")
        print("note: this binary has no metrics.listen; the metrics default is not exercised")
    # environment wins over the container defaults, kafka.* maps
    extra = dict(MFSTREAM_SNAPSHOT_DIR="/from/env", MFSTREAM_KAFKA_BOOTSTRAP_SERVERS="kafka:9092",
                 MFSTREAM_SGD_LAMBDA_P="0.05", MFSTREAM_KAFKA_SASL_MECHANISMS="SCRAM-SHA-512")
    if HAVE_METRICS:
        extra["MFSTREAM_METRICS_LISTEN"] = "127.0.0.1:9999"
    p = run(["sh", ENTRY, "config"], env=dict(env, **extra))
    got = conf_of(p.stdout)
    check(p.returncode == 0 and got.get("snapshot.dir") == "/from/env", "MFSTREAM_SNAPSHOT_DIR beats the default")
    check(got.get("kafka.bootstrap.servers") == "kafka:9092", "MFSTREAM_KAFKA_BOOTSTRAP_SERVERS -> kafka.bootstrap.servers")
    check(got.get("kafka.sasl.mechanisms") == "SCRAM-SHA-512", "MFSTREAM_KAFKA_SASL_MECHANISMS -> kafka.sasl.mechanisms")
    check(got.get("sgd.lambda_p") == "0.05", "MFSTREAM_SGD_LAMBDA_P -> sgd.lambda_p")
    if HAVE_METRICS:
        check(got.get("metrics.listen") == "127.0.0.1:9999", "MFSTREAM_METRICS_LISTEN beats the default")
    check("container default" not in p.stderr, "no default logged when the environment sets the keys")
    # a config file (MFSTREAM_CONFIG or --config) wins too; env beats the file
    conf = os.path.join(tmp, "c.conf")
    with open(conf, "w") as f:
        f.write("[snapshot]\ndir = /from/file\n[serve]\nsnapshot_ms = 250\n")
    p = run(["sh", ENTRY, "config"], env=dict(env, MFSTREAM_CONFIG=conf))
    check(conf_of(p.stdout).get("snapshot.dir") == "/from/file", "MFSTREAM_CONFIG's snapshot.dir beats the default")
    p = run(["sh", ENTRY, "config", "--config", conf], env=env)
    got = conf_of(p.stdout)
    check(got.get("snapshot.dir") == "/from/file" and got.get("serve.snapshot_ms") == "250",
          "--config FILE's snapshot.dir beats the default")
    p = run(["sh", ENTRY, "config", "--config=" + conf], env=dict(env, MFSTREAM_SERVE_SNAPSHOT_MS="500"))
    check(conf_of(p.stdout).get("serve.snapshot_ms") == "500", "env beats --config=FILE")
    # errors: the binary's message, exit 2
    p = run(["sh", ENTRY, "serve"], env=dict(env, MFSTREAM_BOGUS_KEY="1"))
    check(p.returncode == 2 and "MFSTREAM_BOGUS_KEY" in p.stderr, "an unknown MFSTREAM_* variable: exit 2 naming it")
    p = run(["sh", ENTRY, "config", "--config", os.path.join(tmp, "missing.conf")], env=env)
    check(p.returncode == 2 and "missing.conf" in p.stderr, "a missing config file: exit 2 naming it")
    # flags only: serve is the default command
    p = run(["sh", ENTRY, "--serve.batch_size", "0"], env=env)
    check(p.returncode == 2 and "mfstream serve" in p.stderr, "leading --flags go to mfstream serve")
    p = run(["sh", ENTRY, "--version"], env=env)
    check(p.returncode == 0 and p.stdout.startswith("mfstream "), "--version reaches mfstream")
    # anything else runs as it is (the reader image's mfs-reader-example, a shell)
    p = run(["sh", ENTRY, "sh", "-c", 'echo "passthrough $MFSTREAM_SNAPSHOT_DIR"'], env=env)
    check(p.returncode == 0 and p.stdout.strip() == "passthrough", "other commands pass through, without defaults")


def test_entrypoint_unwritable():
    """A snapshot.dir the container's user cannot write (a root-owned bind mount): serve and train
    stop in the entrypoint with exit 1, naming the directory and the uid that needs write access;
    a writable --snapshot.dir passes the check. As root the entrypoint runs as uid 10001 (the
    images' user) through setpriv."""
    ro = tempfile.mkdtemp(prefix="mfs-deploy-ro-")
    rw = tempfile.mkdtemp(prefix="mfs-deploy-rw-")
    try:
        if os.geteuid() == 0:
            setpriv = shutil.which("setpriv")
            if not setpriv:
                print("note: no setpriv (util-linux); the unwritable snapshot.dir check is not exercised")
                return
            uid, prefix = 10001, [setpriv, "--reuid", "10001", "--regid", "10001", "--clear-groups"]
            os.chmod(ro, 0o755)             # root's, as a bind mount made by root
            os.chown(rw, uid, uid)
            if run(prefix + ["test", "-x", BIN]).returncode != 0:
                print("note: uid 10001 cannot run %s; the unwritable snapshot.dir check is not exercised" % BIN)
                return
        else:
            uid, prefix = os.geteuid(), []
            os.chmod(ro, 0o555)
        env = base_env(MFS_DEFAULT_SNAPSHOT_DIR=os.path.join(ro, "snap"))
        cases = (("serve, the container default", ["serve", "--serve.batch_size", "0"]),
                 ("train --snapshot DIR", ["train", "--input", "x", "--snapshot", os.path.join(ro, "a", "b")]),
                 ("serve --snapshot.dir=DIR", ["serve", "--snapshot.dir=" + ro]))
        for what, args in cases:
            p = run(prefix + ["sh", ENTRY] + args, env=env)
            err = [ln for ln in p.stderr.splitlines() if "level=error" in ln]
            check(p.returncode == 1 and len(err) == 1 and "not writable" in err[0] and ("uid=%d" % uid) in err[0]
                  and ("chown -R %d:%d" % (uid, uid)) in err[0] and ro in err[0],
                  "%s on a root-owned directory: exit 1 with a hint naming uid %d (exit %d): %s"
                  % (what, uid, p.returncode, p.stderr.strip()[-600:]))
        p = run(prefix + ["sh", ENTRY, "serve", "--snapshot.dir", os.path.join(rw, "snap"), "--serve.batch_size", "0"],
                env=env)
        check(p.returncode == 2 and "not writable" not in p.stderr and "serve.batch_size" in p.stderr,
              "a writable --snapshot.dir passes the check (then the binary's own error): exit %d %s"
              % (p.returncode, p.stderr.strip()[-300:]))
    finally:
        shutil.rmtree(ro, ignore_errors=True)
        shutil.rmtree(rw, ignore_errors=True)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def wait_for(fn, timeout, step=0.1):
    end = time.monotonic() + seconds(timeout)
    while time.monotonic() < end:
        v = fn()
        if v:
            return v
        time.sleep(step)
    return fn()


def meta_of(bin_env, snap):
    p = run([BIN, "inspect", "--snapshot", snap], env=bin_env)
    return conf_of(p.stdout) if p.returncode == 0 else {}


def test_service_lifecycle(tmp, compose):
    """The compose mfstream service's environment, on the embedded broker with the CPU engine:
    start through the entrypoint, feed it, SIGTERM -> exit 0 and a final snapshot."""
    snap = os.path.join(tmp, "live-snap")
    menv = {k: v for k, v in env_dict(compose["services"]["mfstream"]).items()
            if k.startswith("MFSTREAM_") and not k.startswith("MFSTREAM_KAFKA_BOOTSTRAP")}
    menv.update(MFSTREAM_ENGINE_KIND="cpu", MFSTREAM_MODEL_K="32", MFSTREAM_SERVE_SNAPSHOT_MS="100")
    port = free_port()
    env = base_env(MFS_DEFAULT_SNAPSHOT_DIR=snap, MFS_DEFAULT_METRICS_LISTEN="127.0.0.1:%d" % port, **menv)
    out, err = open(os.path.join(tmp, "serve.out"), "w+"), open(os.path.join(tmp, "serve.err"), "w+")
    proc = spawn(["sh", ENTRY, "--embedded-broker", "--partitions", "2"], env=env, stdout=out, stderr=err)
    try:
        def addr():
            out.seek(0)
            m = re.search(r"bootstrap=(\S+)", out.read())
            return m.group(1) if m else None
        a = wait_for(addr, 30)
        if not check(a, "serve started through the entrypoint"):
            err.seek(0)
            print(err.read()[-2000:])
            return
        exe = os.path.realpath("/proc/%d/exe" % proc.pid)
        check(exe == os.path.realpath(BIN), "the entrypoint exec'd mfstream (pid %d is %s)" % (proc.pid, exe))
        if HAVE_METRICS:
            hc = lambda: run(["bash", os.path.join(DEPLOY, "healthcheck.sh")],
                             env=base_env(MFS_DEFAULT_METRICS_LISTEN="0.0.0.0:%d" % port)).returncode == 0
            check(wait_for(hc, 20, 0.5), "healthcheck.sh passes against the running service: serve must answer "
                  "/healthz on metrics.listen (127.0.0.1:%d), the key this binary has" % port)
        n = 3000
        p = run([BIN, "produce", "--brokers", a, "--topic", menv.get("MFSTREAM_SERVE_TOPICS", "ratings"),
                 "--synthetic", "--gen.ratings", str(n), "--gen.users", "300", "--gen.items", "200"],
                env=base_env(), timeout=120)
        check(p.returncode == 0, "produce into the service's broker: %s" % p.stderr[-300:])
        msgs = int(re.search(r"messages=(\d+)", p.stdout).group(1)) if "messages=" in p.stdout else -1
        applied = lambda: meta_of(base_env(), snap).get("events_applied") == str(n)
        check(wait_for(applied, 60, 0.2), "the service applied all %d events" % n)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=seconds(60))
        check(rc == 0, "SIGTERM through the entrypoint: exit 0 (got %s)" % rc)
        err.seek(0)
        if rc != 0:
            print(err.read()[-2000:])
        m = meta_of(base_env(), snap)
        offs = sum(int(v) for k, v in m.items() if k.startswith("offset/"))
        check(m.get("events_applied") == str(n) and offs == msgs,
              "final snapshot: events_applied %s, offsets %d = %d messages" % (m.get("events_applied"), offs, msgs))
        if HAVE_METRICS:
            check(not hc(), "healthcheck.sh fails once the service is gone")
    finally:
        stop(proc)
    # the example reader on the live snapshot
    reader = os.path.join(DEPLOY, "reader_example.py")
    py = sys.executable
    p = run([py, reader, snap, "--user", "1", "--top", "5", "--once"], env=base_env())
    line = p.stdout.strip()
    check(p.returncode == 0 and "seq=" in line and "events_applied=%d" % n in line,
          "reader example reads the final snapshot: %s %s" % (line, p.stderr))
    check(re.search(r'top="(\S+:[-0-9.]+ ?){5}"', line) is not None or "not in the model" in line,
          "reader example prints 5 items: %s" % line)
    p = run([py, reader, os.path.join(tmp, "nothing"), "--once"], env=base_env())
    check(p.returncode == 1 and "no snapshot" in p.stderr, "reader example without a snapshot: exit 1")
    rp = spawn([py, reader, snap, "--interval", "0.2"], stdout=subprocess.PIPE, text=True, env=base_env())
    try:
        first = rp.stdout.readline()
        rp.send_signal(signal.SIGTERM)
        check(rp.wait(timeout=seconds(10)) == 0 and "seq=" in first, "reader example stops cleanly on SIGTERM")
    finally:
        stop(rp)


class _Stub(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code = {"/healthz": 200, "/readyz": 503}.get(self.path, 404)
        try:
            self.send_response(code)
            self.end_headers()
            self.wfile.write(b"ok\n" if code == 200 else b"no\n")
        except OSError:  # the check hangs up after the status line
            pass

    def log_message(self, *a):
        pass


def test_healthcheck():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    port = srv.server_address[1]
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    hc = os.path.join(DEPLOY, "healthcheck.sh")
    try:
        env = base_env(MFSTREAM_METRICS_LISTEN="0.0.0.0:%d" % port)
        p = run(["bash", hc], env=env)
        check(p.returncode == 0, "healthcheck: /healthz 200 -> 0 (%s)" % p.stderr)
        p = run(["bash", hc, "/readyz"], env=env)
        check(p.returncode == 1 and "503" in p.stderr, "healthcheck: /readyz 503 -> 1 with the status")
        p = run(["bash", hc], env=base_env(MFSTREAM_METRICS_LISTEN="[::]:%d" % port))
        check(p.returncode == 0, "healthcheck: a [::] wildcard is asked on 127.0.0.1")
        p = run(["bash", hc], env=base_env(MFS_DEFAULT_METRICS_LISTEN="0.0.0.0:%d" % port))
        check(p.returncode == 0, "healthcheck: MFS_DEFAULT_METRICS_LISTEN is used: %s" % p.stderr)
        if HAVE_METRICS:  # the address from the container's config file
            conf = os.path.join(tempfile.mkdtemp(prefix="mfs-hc-"), "m.conf")
            with open(conf, "w") as f:
                f.write("[metrics]\nlisten = 127.0.0.1:%d\n" % port)
            p = run(["bash", hc], env=base_env(MFSTREAM_CONFIG=conf))
            check(p.returncode == 0, "healthcheck: metrics.listen from MFSTREAM_CONFIG: %s" % p.stderr)
            shutil.rmtree(os.path.dirname(conf))
    finally:
        srv.shutdown()
        srv.server_close()
    p = run(["bash", hc], env=base_env(MFSTREAM_METRICS_LISTEN="127.0.0.1:%d" % port))
    check(p.returncode == 1, "healthcheck: nothing listening -> 1")


def test_scripts():
    for s in sorted(os.listdir(DEPLOY)):
        if s.endswith(".sh"):
            path = os.path.join(DEPLOY, s)
            shell = "bash" if open(path).readline().strip().endswith("bash") else "sh"
            p = run([shell, "-n", path])
            check(p.returncode == 0, "%s parses (%s -n): %s" % (s, shell, p.stderr))
    if shutil.which("shellcheck"):
        p = run(["shellcheck"] + [os.path.join(DEPLOY, s) for s in sorted(os.listdir(DEPLOY)) if s.endswith(".sh")])
        check(p.returncode == 0, "shellcheck deploy/*.sh:\n%s" % p.stdout[-2000:])
    else:
        print("note: shellcheck not installed; deploy/*.sh only syntax-checked")
    if shutil.which("dpkg") and shutil.which("ldd"):
        p = run(["sh", os.path.join(DEPLOY, "runtime-deps.sh"), BIN])
        pkgs = set(p.stdout.split())
        check(p.returncode == 0, "runtime-deps.sh runs on the binary: %s" % p.stderr)
        for want in ("librdkafka1", "liblmdb0", "libc6"):
            check(any(x == want or x.startswith(want + "t64") for x in pkgs),
                  "runtime-deps.sh lists %s (got %s)" % (want, sorted(pkgs)))
        p = run(["sh", os.path.join(DEPLOY, "runtime-deps.sh")])
        check(p.returncode == 2, "runtime-deps.sh without arguments: usage, exit 2")
    else:
        print("note: no dpkg/ldd; runtime-deps.sh not exercised")


def main():
    if not os.access(BIN, os.X_OK):
        print("FAIL: MFS_BIN=%s is not an executable" % BIN)
        return 1
    tmp = tempfile.mkdtemp(prefix="mfs-deploy-")
    try:
        test_dockerfile()
        compose = test_compose()
        test_k8s()
        test_scripts()
        test_healthcheck()
        test_entrypoint(tmp)
        test_entrypoint_unwritable()
        test_producer_command(compose)
        test_service_lifecycle(tmp, compose)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return report("test_deploy")


if __name__ == "__main__":
    sys.exit(main())
