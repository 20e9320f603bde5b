"""How many threads the kernels' parallel loops use.

The kernels parallelise their outer loops through TVM's runtime thread pool.  TVM sizes that
pool, once per calling thread when its first parallel kernel runs, from ``TVM_NUM_THREADS``,
else ``OMP_NUM_THREADS``, else *half* the logical CPUs (it assumes two hyperthreads per
core).  On a 2-vCPU machine that is one thread: every kernel compiled for 2 cores ran on
one, and onnxc was compared with a 2-thread onnxruntime at half its speed.

So a session sizes the pool itself before its first run: ``intra_op_num_threads`` when the
caller sets it (as in onnxruntime's ``SessionOptions``), else the cores the artifact was
compiled for (the target's ``num-cores``), at most the CPUs this process may run on.  A
``TVM_NUM_THREADS`` the user exported wins over both.  The pool can shrink later
(``runtime.config_threadpool``) but never grow past the size it started with, and it is
shared by every session of the calling thread: the last session configured sets it.
Threads are not pinned to cores (``TVM_BIND_THREADS=0`` unless the user set it): on a
shared machine pinning ties a kernel to a busy core, and pinning the calling thread changed
what the rest of the process saw as available CPUs.
"""

from __future__ import annotations

import os

from . import parallel

_ENV = "TVM_NUM_THREADS"


def available_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def configure(requested: int, compiled_for: int) -> int:
    """Size TVM's pool for this process; returns the threads the kernels will use.

    ``requested`` (0 = not set) wins over ``compiled_for`` (the target's cores); the
    result is at most the available CPUs and at least 1.  A user-set ``TVM_NUM_THREADS``
    is left alone unless ``requested`` is set.
    """
    import tvm_ffi

    # TVM pins its pool's threads to cores unless told not to; pinning the calling thread
    # shrinks os.sched_getaffinity for the rest of the process (a 1-thread session left the
    # process on one CPU, and the next compile for "host" saw one core)
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    cpus = available_cpus()
    if requested > 0:
        want = min(int(requested), cpus)
    elif _ENV in os.environ:
        try:
            want = max(1, int(os.environ[_ENV]))
        except ValueError:
            want = cpus
    else:
        want = max(1, min(int(compiled_for or cpus), cpus))
    if _ENV not in os.environ or requested > 0:
        # read by TVM when a thread's pool is created; later calls can only shrink it
        os.environ[_ENV] = str(max(want, int(os.environ.get(_ENV, "0") or 0)))
    tvm_ffi.get_global_func("runtime.config_threadpool")(1, want)
    used = int(tvm_ffi.get_global_func("runtime.NumThreads")())
    return parallel.configure(used)  # onnxc's launcher (runtime/parallel.py), when installed
