"""Converters that misbehave inside the compile process, for tests/compiler/test_isolate.py.

Module-level functions, so that ``compiler.isolate`` can send them to the compile process
by reference.  Nothing registers them at import: the tests register and remove them.
"""

import os
import signal
import time

from compiler.errors import UnsupportedError


def segfault(bb, inputs, attrs, ctx):
    os.kill(os.getpid(), signal.SIGSEGV)


def abort(bb, inputs, attrs, ctx):
    os.abort()


def sleep(bb, inputs, attrs, ctx):
    time.sleep(600)


def refuse(bb, inputs, attrs, ctx):
    raise UnsupportedError(f"node {ctx.node.name!r}: crash_ops.refuse says no")
