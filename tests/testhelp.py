"""testhelp.py - the Python tests' checks, counted like testhelp.h's (tests/integration/*.py), and
their child processes: each runs in a process group of its own, and a group that outlives its
time limit, or the test, is killed whole (killing only the direct child would leave what it
started, a dpkg-query under sh, running orphaned)."""

import atexit
import os
import signal
import subprocess

failures = []
passed = 0


def check(cond, what):
    """Count a check; print and remember a failed one. Returns cond."""
    global passed
    if cond:
        passed += 1
    else:
        failures.append(what)
        print("FAIL: %s" % what, flush=True)
    return cond


def report(name):
    """Print the tally; the exit status for it."""
    print("%s: %d passed, %d failed" % (name, passed, len(failures)))
    return 1 if failures else 0


def seconds(s):
    """A time limit of s seconds times MFS_TEST_TIMEOUT_SCALE (default 3, as testhelp.h's
    test_seconds). Limits bound waits, so a larger factor slows only a failing test."""
    try:
        f = float(os.environ.get("MFS_TEST_TIMEOUT_SCALE") or 3)
    except ValueError:
        f = 3
    return s * (f if f > 0 else 3)


_groups = set()


def _kill_group(pgid):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    _groups.discard(pgid)


def _kill_all():
    for pgid in list(_groups):
        _kill_group(pgid)


def _on_signal(signum, frame):
    _kill_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


atexit.register(_kill_all)
for _sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(_sig, _on_signal)


def spawn(args, **kw):
    """subprocess.Popen in a process group of its own; stop it with stop() (the group is killed
    at exit in any case)."""
    p = subprocess.Popen(args, start_new_session=True, **kw)
    _groups.add(p.pid)
    return p


def stop(p):
    """Kill p's whole process group (whatever it started too) and reap p."""
    _kill_group(p.pid)
    p.wait()


def run(args, timeout=60, **kw):
    """subprocess.run with output captured as text, in a process group of its own; past
    seconds(timeout) the whole group is killed and subprocess.TimeoutExpired raised."""
    p = spawn(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
    try:
        out, err = p.communicate(timeout=seconds(timeout))
    except BaseException:
        stop(p)
        raise
    _kill_group(p.pid)  # p exited; nothing it started outlives it
    return subprocess.CompletedProcess(args, p.returncode, out, err)
