#!/usr/bin/env python3
"""Run an onnxc artifact with the repository's runtime and save its outputs (any arch).

Meant to run on aarch64, natively or under user-mode emulation on an x86 host
(``scripts/setup_arm_emulation.sh`` prepares the emulated Python and the aarch64 wheels)::

    CACHE=$(scripts/setup_arm_emulation.sh | tail -1)
    qemu-aarch64-static -L $CACHE/root $CACHE/root/usr/bin/python3.11 \\
        scripts/arm_run.py m.so inputs.npz out.npz --site $CACHE/site [--repeat 3]

``inputs.npz`` holds one array per model input (by name); ``out.npz`` gets one array per
output (by name) and ``__seconds__``, the wall time of each run.  Only ``runtime/``,
numpy and TVM's runtime are needed: nothing from ``compiler/``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact")
    p.add_argument("inputs", help=".npz with one array per model input")
    p.add_argument("outputs", help=".npz to write, one array per model output")
    p.add_argument("--site", action="append", default=[],
                   help="a directory of unpacked wheels (numpy, tvm) to put on sys.path")
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args(argv)

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [repo, *args.site]
    import numpy as np

    import runtime

    try:
        sess = runtime.load(args.artifact)
    except runtime.ArtifactError as e:
        print(f"arm_run: {e}", file=sys.stderr)
        return 1
    with np.load(args.inputs) as z:
        feeds = {k: z[k] for k in z.files}
    seconds = []
    for _ in range(max(1, args.repeat)):
        t = time.perf_counter()
        outs = sess.run(None, feeds)
        seconds.append(time.perf_counter() - t)
    names = [o.name for o in sess.get_outputs()]
    np.savez(args.outputs, __seconds__=np.array(seconds), **dict(zip(names, outs)))
    print(f"arm_run: {platform.machine()} ran {args.artifact} {len(seconds)}x, "
          f"best {min(seconds) * 1e3:.2f} ms; outputs {names}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
