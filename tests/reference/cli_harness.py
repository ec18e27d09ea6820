"""What the command-line reference checks share: the paths CTest passes in the environment
(WHITTLE_BIN, WHITTLE_SOURCE_DIR, WHITTLE_BINARY_DIR), the bundled digits, and check/finish,
which print one ok/FAIL line per check (check returns the condition) and exit non-zero when any
failed."""
import os
import sys

BIN = os.environ["WHITTLE_BIN"]
SRC = os.environ["WHITTLE_SOURCE_DIR"]
BUILD = os.environ["WHITTLE_BINARY_DIR"]
MNIST = os.path.join(SRC, "data", "mnist10k")
failures = []


def out_dir(name):
    """build/testdata/<name>: where a check writes its runs."""
    return os.path.join(BUILD, "testdata", name)


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


def finish():
    print(f"{len(failures)} failed" if failures else "all passed")
    sys.exit(1 if failures else 0)
