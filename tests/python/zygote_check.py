"""What the tests' zygote must pass on from a script (tests/real/zygote.rs): the mode in
DEVMAP_ZYGOTE_CHECK says how this script ends.

Usage: DEVMAP_ZYGOTE_CHECK=ok|exit3|raise|exec|atexit python zygote_check.py DEVMAP
"""

import atexit
import os
import sys

mode = os.environ["DEVMAP_ZYGOTE_CHECK"]
print(f"argv {sys.argv[1:]} main {__name__}")
print("to stderr", file=sys.stderr)
if mode == "exit3":
    sys.exit(3)
if mode == "raise":
    raise ValueError("raised on purpose")
if mode == "exec":
    os.execv(sys.executable, [sys.executable, "-c", "pass"])
if mode == "atexit":
    atexit.register(lambda: print("atexit ran"))
print("reached the end")
