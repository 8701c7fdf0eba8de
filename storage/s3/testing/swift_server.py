#!/usr/bin/python3
"""A real one-node OpenStack Swift with its s3api middleware on loopback, for tests.

Run with Debian's /usr/bin/python3 (Swift is Debian's python3-swift; tools/install_deps.sh
installs it), never a virtual environment:

    swift_server.py start --dir DIR [--timeout S]   # configs, ring, data and logs in DIR;
                                                    # prints one JSON line (also DIR/server.json)
    swift_server.py stop --dir DIR                  # SIGTERM, then SIGKILL, every server
    swift_server.py kill-proxy --dir DIR            # SIGKILL of the proxy only
    swift_server.py start-proxy --dir DIR           # the proxy back on its port, data kept
    swift_server.py kill-server --dir DIR --server S   # SIGKILL of server S only (account,
                                                       # container, object or proxy)
    swift_server.py start-server --dir DIR --server S  # S back on its port, data kept

`start` writes swift.conf (random hash path prefix and suffix), one-device rings for account,
container and object, the three storage servers' confs (devices=DIR/srv, mount_check=false,
127.0.0.1, free ports) and a proxy whose pipeline has s3api before tempauth, with one admin user
whose S3 access key id ("account:user", tempauth's form) and secret are generated per start.
Each server runs as one process (workers=0) in a session of its own, detached from the caller;
its log is DIR/logs/<server>.log. `start` returns once a SigV4-signed ListBuckets succeeds, or
fails, naming the log dir, when the deadline passes. No replicator, updater or auditor runs:
nothing here needs them with one device and one replica.
"""

import argparse
import contextlib
import datetime
import hashlib
import hmac
import importlib.util
import json
import os
import pwd
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

REGION = "us-east-1"
STORAGE = ("account", "container", "object")
SERVERS = STORAGE + ("proxy",)
POLL_S = 0.05


def free_port():
    """A port the kernel just handed out on 127.0.0.1 (free now; the servers bind it next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def common_conf(d, port):
    # bind_timeout: a port taken meanwhile fails the bind in 2 s (Swift's default waits 30),
    # and start() tries again with fresh ports.
    return (f"[DEFAULT]\nbind_ip = 127.0.0.1\nbind_port = {port}\nworkers = 0\n"
            "bind_timeout = 2\n"
            f"swift_dir = {d}\ndevices = {d}/srv\nmount_check = false\n"
            f"disable_fallocate = true\nlog_level = INFO\nlog_address = {d}/no-syslog\n"
            # run_wsgi switches to `user` (default "swift"): stay who we are.
            f"user = {pwd.getpwuid(os.getuid()).pw_name}\n")


def storage_conf(d, kind, port):
    return (common_conf(d, port) +
            f"\n[pipeline:main]\npipeline = healthcheck {kind}-server\n"
            f"\n[app:{kind}-server]\nuse = egg:swift#{kind}\n"
            "\n[filter:healthcheck]\nuse = egg:swift#healthcheck\n")


PROXY_PIPELINE = ("catch_errors gatekeeper healthcheck proxy-logging cache listing_formats "
                  "s3api tempauth copy slo dlo proxy-logging proxy-server")


def proxy_conf(d, port, account, user, secret):
    filters = ["catch_errors", "gatekeeper", "healthcheck", "proxy-logging", "cache",
               "listing_formats", "copy", "slo", "dlo"]
    text = common_conf(d, port) + f"\n[pipeline:main]\npipeline = {PROXY_PIPELINE}\n"
    # No error limiting: Swift's proxy skips a node for 60 s once it has failed 10 requests, so
    # a storage server killed and restarted by a test (kill-server, start-server) would still
    # be answered with 503s for a minute; here it is used again as soon as it is back.
    text += ("\n[app:proxy-server]\nuse = egg:swift#proxy\naccount_autocreate = true\n"
             "error_suppression_limit = 1000000\n")
    entry = {"cache": "memcache"}  # egg entry points, where not the filter's name
    text += "".join(f"\n[filter:{f}]\nuse = egg:swift#{entry.get(f, f.replace('-', '_'))}\n"
                    for f in filters)
    # s3api: path-style at http://127.0.0.1:PORT, virtual-hosted at BUCKET.localhost:PORT.
    text += (f"\n[filter:s3api]\nuse = egg:swift#s3api\nlocation = {REGION}\n"
             "storage_domain = localhost\n")
    text += (f"\n[filter:tempauth]\nuse = egg:swift#tempauth\n"
             f"user_{account}_{user} = {secret} .admin\n")
    return text


def build_ring(d, kind, port):
    """A one-partition, one-replica, one-device ring: what swift-ring-builder create 0 1 1, add
    and rebalance make, with its library in the launcher (three swift-ring-builder runs cost
    ~1 s of imports)."""
    from swift.common.ring import RingBuilder
    builder = RingBuilder(0, 1, 1)
    builder.add_dev({"id": 0, "region": 1, "zone": 1, "ip": "127.0.0.1", "port": port,
                     "device": "d1", "weight": 1.0, "meta": ""})
    builder.rebalance()
    builder.save(os.path.join(d, f"{kind}.builder"))
    builder.get_ring().save(os.path.join(d, f"{kind}.ring.gz"))


def spawn(d, kinds, owner, deadline, rings=None):
    """Starts the `kinds` servers, each detached in a session of its own, through one launcher
    process that imports Swift once and forks them (4 processes importing Swift each cost ~2 s
    of CPU on a 2-core machine). Builds the rings first when `rings` ({kind: port}) is given.
    Returns {kind: pid}."""
    env = dict(os.environ, EVENTLET_NO_GREENDNS="yes")  # loopback IPs only: no DNS (~0.9 s)
    cmd = [sys.executable, "-I", os.path.abspath(__file__), "launch", d, str(owner),
           json.dumps(rings or {})] + list(kinds)
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, env=env,
                              timeout=max(0.05, deadline - time.monotonic()), check=False)
    except subprocess.TimeoutExpired:
        fail(d, "the launcher did not start the servers before the deadline", DEADLINE_EXIT)
    try:
        pids = json.loads(proc.stdout)
        return {kind: int(pids[kind]) for kind in kinds}
    except (ValueError, KeyError, TypeError):
        fail(d, f"the launcher failed (exit {proc.returncode}): {proc.stderr.decode()[-2000:]}")


def exit_with(owner):
    """Ends this process once `owner` is gone (a test that crashed never calls stop). A real
    thread started before run_wsgi's eventlet patching, with the unpatched time.sleep."""
    sleep = time.sleep

    def watch():
        while alive(owner):
            sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


def serve(d, kind, owner):
    """A forked server (never returns): a session of its own, its log as stdout and stderr, and
    Swift's own run_wsgi on DIR/<kind>-server.conf."""
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        log = os.open(os.path.join(d, "logs", f"{kind}.log"),
                      os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        if owner:
            exit_with(owner)
        from swift.common.wsgi import run_wsgi
        code = run_wsgi(os.path.join(d, f"{kind}-server.conf"), f"{kind}-server", verbose=True)
    except BaseException:  # noqa: B902: anything, into the log, then out
        import traceback
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code or 0)


def launch(d, owner, rings, kinds):
    """The launcher: imports Swift, reads swift.conf from DIR rather than /etc/swift, builds the
    rings asked for, forks one server per kind and prints {kind: pid}."""
    from swift.common import utils
    from swift.common import wsgi  # noqa: F401: imported once, before the forks
    from swift.common.storage_policy import reload_storage_policies
    utils.set_swift_dir(d)
    reload_storage_policies()
    for kind, port in rings.items():
        build_ring(d, kind, port)
    pids = {}
    for kind in kinds:
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            serve(d, kind, owner)
        pids[kind] = pid
    print(json.dumps(pids), flush=True)


def sign_v4(method, url, access_key, secret, payload=b""):
    """Headers of an AWS SigV4 request (service s3, REGION): the readiness probe only."""
    parsed = urllib.parse.urlsplit(url)
    now = datetime.datetime.now(datetime.timezone.utc)
    amz_date, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    payload_hash = hashlib.sha256(payload).hexdigest()
    headers = {"host": parsed.netloc, "x-amz-content-sha256": payload_hash,
               "x-amz-date": amz_date}
    signed = ";".join(sorted(headers))
    canonical = "\n".join([method, parsed.path or "/", parsed.query,
                           "".join(f"{k}:{headers[k]}\n" for k in sorted(headers)), signed,
                           payload_hash])
    scope = f"{day}/{REGION}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("AWS4" + secret).encode()
    for part in (day, REGION, "s3", "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
                                f"SignedHeaders={signed}, Signature={signature}")
    return headers


def create_bucket(d, info, bucket, deadline):
    """PUTs `bucket` (signed as the test user); exits naming it when the server refuses."""
    url = f"{info['endpoint']}/{bucket}"
    headers = sign_v4("PUT", url, info["access_key_id"], info["secret_access_key"])
    request = urllib.request.Request(url, data=b"", method="PUT", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=max(1.0, deadline - time.monotonic())):
            return
    except (OSError, ValueError) as e:
        fail(d, f"creating bucket {bucket}: {e}")


def http_status(url, headers=None, timeout=2.0):
    """The HTTP status of a GET, or None when the server does not answer."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, ValueError):
        return None


def alive(pid):
    """Whether pid runs (a zombie does not: the servers' parent may never reap them)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


DEADLINE_EXIT = 3  # the exit status when the deadline passed (other failures: 1)


def fail(d, message, code=1):
    print(f"swift_server: {message}; the servers' logs are in {d}/logs", file=sys.stderr)
    sys.exit(code)


def wait_ready(d, info, kinds, deadline):
    """Polls each server's /healthcheck, then a signed ListBuckets, until the deadline."""
    for kind in kinds:
        url = f"http://127.0.0.1:{info['ports'][kind]}/healthcheck"
        while http_status(url, timeout=1.0) != 200:
            if not alive(info["server_pids"][kind]):
                fail(d, f"the {kind} server exited during start (see {kind}.log)")
            if time.monotonic() > deadline:
                fail(d, f"the {kind} server did not answer {url} in time", DEADLINE_EXIT)
            time.sleep(POLL_S)
    last = None
    while True:
        headers = sign_v4("GET", info["endpoint"] + "/", info["access_key_id"],
                          info["secret_access_key"])
        last = http_status(info["endpoint"] + "/", headers, timeout=5.0)
        if last == 200:
            return
        if time.monotonic() > deadline:
            fail(d, f"a signed S3 ListBuckets on {info['endpoint']} got {last}, not 200, "
                 "before the deadline (see proxy.log)", DEADLINE_EXIT)
        time.sleep(POLL_S)


def record(d, info):
    """DIR/server.json, replaced whole: what stop, kill-proxy and start-proxy read."""
    write(os.path.join(d, "server.json.tmp"), json.dumps(info) + "\n")
    os.replace(os.path.join(d, "server.json.tmp"), os.path.join(d, "server.json"))


def save(d, info):
    public = {k: info[k] for k in ("endpoint", "region", "access_key_id",
                                   "secret_access_key")}
    public["pids"] = [info["server_pids"][k] for k in SERVERS]
    public["dir"] = d
    public["log_dir"] = os.path.join(d, "logs")
    record(d, dict(info, **public))
    print(json.dumps(public), flush=True)


def load(d):
    try:
        with open(os.path.join(d, "server.json")) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        fail(d, f"cannot read {d}/server.json ({e}); was `start --dir {d}` run?")


def port_taken(d):
    """True when a server's log says its port was taken between free_port() and its bind."""
    for kind in SERVERS:
        try:
            with open(os.path.join(d, "logs", f"{kind}.log"), errors="replace") as f:
                text = f.read()
                if "Address already in use" in text or "Could not bind to" in text:
                    return True
        except OSError:
            pass
    return False


def start(d, timeout, owner, bucket=None):
    """start_once, again with fresh ports (up to 3 tries) when another process took a port
    between free_port() and the server's bind: parallel tests start many servers."""
    deadline = time.monotonic() + timeout
    for attempt in range(3):
        try:
            start_once(d, deadline, owner, bucket)
            return
        except SystemExit:
            if attempt == 2 or not port_taken(d) or time.monotonic() > deadline:
                raise
            print("swift_server: a port was taken before a server bound it; trying again "
                  "with fresh ports", file=sys.stderr)
            for kind in SERVERS:  # the next try's logs start empty
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(d, "logs", f"{kind}.log"))


def start_once(d, deadline, owner, bucket):
    for sub in ("srv/d1", "logs"):
        os.makedirs(os.path.join(d, sub), exist_ok=True)
    ports = {kind: free_port() for kind in SERVERS}
    write(os.path.join(d, "swift.conf"),
          f"[swift-hash]\nswift_hash_path_suffix = {secrets.token_hex(8)}\n"
          f"swift_hash_path_prefix = {secrets.token_hex(8)}\n\n"
          "[storage-policy:0]\nname = Policy-0\ndefault = yes\n")
    account, user = "ckpt", "u" + secrets.token_hex(6)
    info = {"endpoint": f"http://127.0.0.1:{ports['proxy']}", "region": REGION,
            "access_key_id": f"{account}:{user}", "secret_access_key": secrets.token_hex(20),
            "ports": ports, "server_pids": {}, "owner": owner}
    for kind in STORAGE:
        write(os.path.join(d, f"{kind}-server.conf"), storage_conf(d, kind, ports[kind]))
    write(os.path.join(d, "proxy-server.conf"),
          proxy_conf(d, ports["proxy"], account, user, info["secret_access_key"]))
    info["server_pids"] = spawn(d, SERVERS, owner, deadline,
                                {k: ports[k] for k in STORAGE})
    # Recorded before waiting, so `stop` finds the servers of a start that failed.
    record(d, info)
    try:
        wait_ready(d, info, SERVERS, deadline)
        if bucket:
            create_bucket(d, info, bucket, deadline)
            info["bucket"] = bucket
    except SystemExit:
        stop(d, quiet=True)
        raise
    save(d, info)


def kill_and_wait(pids, sig, deadline):
    for pid in pids:
        try:
            os.killpg(pid, sig)  # each server leads its own session and group
        except ProcessLookupError:
            pass
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    return [p for p in pids if alive(p)]


def stop(d, quiet=False):
    info = load(d)
    pids = list(info["server_pids"].values())
    left = kill_and_wait(pids, signal.SIGTERM, time.monotonic() + 10)
    if left:
        left = kill_and_wait(left, signal.SIGKILL, time.monotonic() + 10)
    if left and not quiet:
        fail(d, f"processes {left} survived SIGKILL for 10 s")


def kill_server(d, kind):
    """SIGKILL of one server (account, container, object or proxy); the others keep running."""
    info = load(d)
    pid = info["server_pids"][kind]
    if kill_and_wait([pid], signal.SIGKILL, time.monotonic() + 10):
        fail(d, f"the {kind} server (pid {pid}) survived SIGKILL for 10 s")


def start_server(d, kind, timeout, owner):
    """One server killed by kill_server back on its port and conf (data kept); returns once its
    /healthcheck and a signed ListBuckets answer, and prints the JSON line `start` prints."""
    deadline = time.monotonic() + timeout
    info = load(d)
    pid = info["server_pids"][kind]
    if alive(pid):
        fail(d, f"the {kind} server (pid {pid}) is still running")
    info["server_pids"][kind] = spawn(d, [kind], owner or info.get("owner", 0), deadline)[kind]
    record(d, info)
    wait_ready(d, info, [kind], deadline)
    save(d, info)


def kill_proxy(d):
    kill_server(d, "proxy")


def start_proxy(d, timeout, owner):
    start_server(d, "proxy", timeout, owner)


def swift_installed():
    """Whether Swift's s3api is importable, without importing Swift (~1.5 s)."""
    spec = importlib.util.find_spec("swift")
    return spec is not None and any(
        os.path.exists(os.path.join(p, "common", "middleware", "s3api", "s3api.py"))
        for p in spec.submodule_search_locations or [])


def main():
    if len(sys.argv) >= 5 and sys.argv[1] == "launch":
        launch(sys.argv[2], int(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["start", "stop", "kill-proxy", "start-proxy",
                                            "kill-server", "start-server"])
    parser.add_argument("--dir", required=True, help="the server's directory (created)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to be ready")
    parser.add_argument("--owner-pid", type=int, default=0,
                        help="the servers exit when this process does (0: they outlive it)")
    parser.add_argument("--bucket", default=None, help="start: also create this bucket")
    parser.add_argument("--server", choices=SERVERS,
                        help="kill-server, start-server: which server")
    args = parser.parse_args()
    d = os.path.abspath(args.dir)
    if not swift_installed():
        sys.exit(f"swift_server: OpenStack Swift with s3api is not installed for {sys.executable}"
                 ": run tools/install_deps.sh (Debian's swift, swift-proxy, swift-account, "
                 "swift-container, swift-object)")
    if args.command == "start":
        start(d, args.timeout, args.owner_pid, args.bucket)
    elif args.command == "stop":
        stop(d)
    elif args.command == "kill-proxy":
        kill_proxy(d)
    elif args.command == "start-proxy":
        start_proxy(d, args.timeout, args.owner_pid)
    elif args.server is None:
        parser.error(f"{args.command} needs --server ({', '.join(SERVERS)})")
    elif args.command == "kill-server":
        kill_server(d, args.server)
    else:
        start_server(d, args.server, args.timeout, args.owner_pid)


if __name__ == "__main__":
    main()
