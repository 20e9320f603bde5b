#!/usr/bin/env bash
# Set up user-mode emulation of aarch64 Linux on an x86-64 Debian host, to run onnxc's
# runtime on artifacts compiled with `--target arm` (scripts/arm_run.py).
#
#   scripts/setup_arm_emulation.sh            # prints the cache directory on its last line
#   ONNXC_ARM_CACHE=/some/dir scripts/setup_arm_emulation.sh
#
# Idempotent: every step is skipped when its result is already in the cache
# (default ~/.cache/onnxc-arm).  Needs root for apt-get (the toolchain, qemu, and the
# arm64 .debs); PyPI and the Debian mirror must be reachable the first time.
#
# Layout of the cache:
#   root/   an aarch64 sysroot: Debian's arm64 python3.11 + libc etc., unpacked with dpkg -x
#   site/   aarch64 wheels unpacked: apache-tvm, apache-tvm-ffi, numpy, ml_dtypes, typing_extensions,
#           cloudpickle and psutil (TVM's RPC server)
#   wheels/ debs/  downloads
#   ok      marker written when the emulated interpreter imported tvm and numpy
#
# Run:   qemu-aarch64-static -L root root/usr/bin/python3.11 scripts/arm_run.py m.so in.npz out.npz
# with PYTHONPATH=<repo>:site (arm_run.py sets sys.path itself when given --site).
set -euo pipefail

CACHE="${ONNXC_ARM_CACHE:-$HOME/.cache/onnxc-arm}"
ROOT="$CACHE/root"
SITE="$CACHE/site"
WHEELS="$CACHE/wheels"
DEBS="$CACHE/debs"
PY=python3.11
# Versions pinned by pyproject.toml; numpy follows the host's (same ABI, same results).
TVM_PIN="apache-tvm==0.27.0.post1"
FFI_PIN="apache-tvm-ffi==0.1.14.post1"
HOST_PY="${ONNXC_HOST_PYTHON:-python3}"
NUMPY_VER="$($HOST_PY -c 'import numpy; print(numpy.__version__)' 2>/dev/null || echo 2.2.6)"
MLD_VER="$($HOST_PY -c 'import ml_dtypes; print(ml_dtypes.__version__)' 2>/dev/null || echo 0.5.1)"

mkdir -p "$CACHE" "$ROOT" "$SITE" "$WHEELS" "$DEBS"
log() { echo "[setup_arm_emulation] $*" >&2; }

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# 1. cross toolchain and qemu
if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v qemu-aarch64-static >/dev/null; then
    log "installing g++-aarch64-linux-gnu qemu-user-static"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq g++-aarch64-linux-gnu qemu-user-static >/dev/null
fi

# 2. aarch64 wheels (cp311, manylinux aarch64).  --platform manylinux_2_28_aarch64 also
#    accepts the older manylinux2014 (= manylinux_2_17) wheels.
if [ ! -f "$SITE/.done" ]; then
    log "downloading aarch64 wheels: $TVM_PIN $FFI_PIN numpy==$NUMPY_VER ml_dtypes==$MLD_VER"
    $HOST_PY -m pip download -q --only-binary=:all: --no-deps --python-version 3.11 \
        --implementation cp --abi cp311 --abi abi3 --abi none \
        --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 --platform any \
        -d "$WHEELS" "$TVM_PIN" "$FFI_PIN" "numpy==$NUMPY_VER" "ml_dtypes==$MLD_VER" \
        typing_extensions
    for w in "$WHEELS"/*.whl; do
        $HOST_PY -m zipfile -e "$w" "$SITE"
    done
    touch "$SITE/.done"
fi
# 2b. what TVM's RPC server needs besides (scripts/arm_rpc_server.py): cloudpickle, psutil
if [ ! -f "$SITE/.rpc-done" ]; then
    log "downloading aarch64 wheels for the RPC server: cloudpickle psutil"
    $HOST_PY -m pip download -q --only-binary=:all: --no-deps --python-version 3.11 \
        --implementation cp --abi cp311 --abi abi3 --abi none \
        --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 \
        --platform manylinux_2_17_aarch64 --platform any -d "$WHEELS" cloudpickle psutil
    for w in "$WHEELS"/cloudpickle-*.whl "$WHEELS"/psutil-*.whl; do
        $HOST_PY -m zipfile -e "$w" "$SITE"
    done
    touch "$SITE/.rpc-done"
fi

# 3. Debian arm64 python3.11 and the shared libraries it, TVM and numpy need.
DEB_PKGS=(
    python3.11-minimal libpython3.11-minimal libpython3.11-stdlib
    libc6 libgcc-s1 libstdc++6 zlib1g libexpat1 libffi8 libssl3 liblzma5 libbz2-1.0
    libuuid1 libcrypt1 libtinfo6 libncursesw6 libreadline8 libsqlite3-0
    libnsl2 libtirpc3 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libcom-err2
    libkeyutils1 libdb5.3 media-types
)
if [ ! -x "$ROOT/usr/bin/$PY" ]; then
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        log "dpkg --add-architecture arm64"
        $SUDO dpkg --add-architecture arm64
        $SUDO apt-get update -qq
    fi
    log "apt-get download ${#DEB_PKGS[@]} arm64 packages"
    pkgs=()
    for p in "${DEB_PKGS[@]}"; do
        if [ "$p" = media-types ]; then pkgs+=("$p"); else pkgs+=("$p:arm64"); fi
    done
    (cd "$DEBS" && apt-get download -q "${pkgs[@]}" >/dev/null) || {
        $SUDO apt-get update -qq
        (cd "$DEBS" && apt-get download -q "${pkgs[@]}" >/dev/null)
    }
    for d in "$DEBS"/*.deb; do
        dpkg -x "$d" "$ROOT"
    done
fi

# 4. check: the emulated interpreter imports numpy and tvm's runtime
if [ ! -f "$CACHE/ok" ]; then
    log "checking the emulated interpreter"
    PYTHONNOUSERSITE=1 PYTHONPATH="$SITE" qemu-aarch64-static -L "$ROOT" "$ROOT/usr/bin/$PY" -c \
        'import platform, numpy, tvm; print(platform.machine(), numpy.__version__, tvm.__version__)'
    touch "$CACHE/ok"
fi
echo "$CACHE"
