"""testhelp.py - the Python tests' checks, counted like testhelp.h's (tests/integration/*.py)."""

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
