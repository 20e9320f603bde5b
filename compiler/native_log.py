"""TVM's C++ log lines, routed through ``logging`` (logger ``onnxc.tvm``) while we compile.

TVM 0.27 writes ``LOG(INFO/WARNING/ERROR)`` straight to ``std::cerr`` as
``[hh:mm:ss] file:line: Warning: text`` (``tvm/runtime/logging.h``); the only hook,
``TVM_LOG_CUSTOMIZE``, is a build-time switch.  So :func:`routed` points file descriptor 2
at a pipe for the duration of a compile stage, and a thread reads it line by line:

* a TVM log line of level Debug, Info or Warning becomes a DEBUG record of ``onnxc.tvm``
  (hidden by default, shown by ``onnxc -vv`` or any logging configured at DEBUG), e.g.
  the "Fast mode segfaults when there are out-of-bounds indices" that TVM's ``take``
  prints once per Gather kernel (onnxc checks Gather indices at run time instead);
* a TVM Error-level line becomes a WARNING record (shown by default);
* every other line (Python's own stderr: tracebacks, our logging, ``warnings``; LLVM's
  errors; anything unknown) is written through to the real stderr unchanged, as it
  arrives.

The records carry ``tvm file:line: Level: text`` (no ``[hh:mm:ss]`` prefix), so a handler
that writes them back to stderr inside the routed region is passed through, not routed
again; a second thread emits them, so that the reader never writes into the pipe it
drains (a full pipe would block it).  A thread writing to stderr while a stage runs goes through the same pipe (and the
same rules).  A process killed by a signal can lose what the pipe held and the thread had
not yet read (at most one pipe buffer, 64 KiB); the compile child's crash report
(``compiler/isolate.py``) is written to a file of its own, not to stderr.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import re
import sys
import threading

LOGGER = logging.getLogger("onnxc.tvm")

# logging.h: "[" %H:%M:%S "] " file ":" line then ": Debug: " | ": " | ": Warning: " | ": Error: "
_TVM_LINE = re.compile(rb"^\[\d\d:\d\d:\d\d\] (\S+?):(\d+): (?:(Debug|Warning|Error): )?(.*)$")

_lock = threading.Lock()
_depth = 0
_state: dict = {}


@contextlib.contextmanager
def routed():
    """Route TVM's native log lines through ``logging`` inside this block (re-entrant,
    process-wide: fd 2 is one per process)."""
    global _depth
    with _lock:
        if _depth == 0:
            _install()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _uninstall()


def _install() -> None:
    for stream in (sys.stdout, sys.stderr):  # what Python buffered goes out in order
        try:
            stream.flush()
        except (AttributeError, ValueError, OSError):
            pass
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all (a daemon): TVM's writes go nowhere either way
        return
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    records: queue.SimpleQueue = queue.SimpleQueue()
    reader = threading.Thread(target=_forward, args=(read_fd, saved, records),
                              name="onnxc-tvm-log-reader", daemon=True)
    emitter = threading.Thread(target=_emit, args=(records,), name="onnxc-tvm-log",
                               daemon=True)
    reader.start()
    emitter.start()
    _state.update(saved=saved, reader=reader, emitter=emitter)


def _uninstall() -> None:
    try:
        sys.stderr.flush()
    except (AttributeError, ValueError, OSError):
        pass
    if not _state:  # _install found no stderr
        return
    saved, reader, emitter = _state.pop("saved"), _state.pop("reader"), _state.pop("emitter")
    os.dup2(saved, 2)  # closes our write end of the pipe: the reader sees EOF
    # A child process started inside the block (a compiler, a tuning worker) may still hold
    # the write end; the reader then keeps forwarding its lines, to the saved descriptor.
    reader.join(timeout=5)
    if not reader.is_alive():
        emitter.join(timeout=5)
        os.close(saved)


def _forward(read_fd: int, out_fd: int, records: queue.SimpleQueue) -> None:
    pending = b""
    try:
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            while True:
                chunk = pipe.read(65536)
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    _route(line, out_fd, records)
        if pending:
            _route(pending, out_fd, records, newline=False)
    finally:
        records.put(None)


def _route(line: bytes, out_fd: int, records: queue.SimpleQueue, newline: bool = True) -> None:
    m = _TVM_LINE.match(line)
    if m is None:
        _write_all(out_fd, line + b"\n" if newline else line)
        return
    file, lineno, level, text = m.groups()
    level = (level or b"Info").decode()
    records.put((logging.WARNING if level == "Error" else logging.DEBUG,
                 f"tvm {file.decode(errors='replace')}:{lineno.decode()}: {level}: "
                 f"{text.decode(errors='replace')}"))


def _emit(records: queue.SimpleQueue) -> None:
    while (record := records.get()) is not None:
        LOGGER.log(record[0], "%s", record[1])


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            n = os.write(fd, data)
        except InterruptedError:
            continue
        except OSError:  # stderr closed: nothing left to write to
            return
        data = data[n:]
