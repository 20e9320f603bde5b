"""A TVM RPC server for aarch64, run under qemu-user, registered at a tracker (for `onnxc tune
--target arm --rpc-tracker ... --rpc-key ...`).

    C=$(scripts/setup_arm_emulation.sh | tail -1)
    qemu-aarch64-static -L $C/root $C/root/usr/bin/python3.11 scripts/arm_rpc_server.py \\
        --site $C/site --tracker 127.0.0.1:9190 --key arm-qemu

Why not ``python -m tvm.exec.rpc_server``: ``tvm.rpc.Server`` starts the server in a fresh
interpreter (``PopenWorker`` execs ``sys.executable``), and without binfmt_misc an emulated
process cannot exec an aarch64 binary.  This script starts the same server state
(``tvm.rpc.server._popen_start_rpc_server``) in its own process; each session is still
served in a forked child (fork works under qemu-user).  Timings under emulation prove the
plumbing, not ARM speed.
"""

import argparse
import sys
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--site", required=True, help="the aarch64 site-packages (setup_arm_emulation.sh)")
    p.add_argument("--tracker", required=True, help="HOST:PORT of the RPC tracker")
    p.add_argument("--key", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9095)
    p.add_argument("--port-end", type=int, default=9199)
    args = p.parse_args()
    sys.path.insert(0, args.site)
    from tvm.rpc import server

    host, _, port = args.tracker.rpartition(":")
    bound = server._popen_start_rpc_server(args.host, args.port, args.port_end,
                                           tracker_addr=(host, int(port)), key=args.key,
                                           custom_addr=args.host)
    print(f"aarch64 RPC server on {args.host}:{bound}, key {args.key!r}, tracker {args.tracker}",
          flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
