#!/bin/sh
# Run the recipes of docs/deploy.md on this machine, without a container
# engine, and time each one's cold start side by side with plain Python
# (python -m pycds bench: medians of per-rep ratios).
#
#   scripts/deploy_recipes.sh [PYTHON] [WORKDIR]
#
# PYTHON: the interpreter of the "image" (default python3); WORKDIR: where
# the trees are built (default /tmp/pycds-deploy, emptied first).  Needs
# root: the container and read-only recipes run in a mount namespace of
# their own (unshare -m), where the built tree is bind-mounted read-only at
# the paths of the runtime image and the program runs as user nobody.
# REPS (default 21) sets the timed runs of each variant.
set -eu
PY=${1:-python3}
W=${2:-/tmp/pycds-deploy}
REPS=${REPS:-21}
SRC=$(cd "$(dirname "$0")/.." && pwd)
rm -rf "$W"
mkdir -p "$W"
W=$(cd "$W" && pwd)
say() { printf '\n== %s\n' "$*"; }

# ---- 1. container image, multi-stage ---------------------------------------
say "container: build stage (a tree at $W/build, as the build stage's /opt)"
B=$W/build/opt
"$PY" -m venv "$B/venv"
"$B/venv/bin/pip" install -q "$SRC[demo]"
mkdir -p "$B/app"
cp "$SRC/examples/service.py" "$B/app/"
"$B/venv/bin/python" "$B/app/service.py" --write-weights "$B/app/weights.safetensors"
chmod a+r "$B/app/weights.safetensors"     # (written 0600) for the runtime's user
# The build stage's last step: one run of the program under DUMP.
(cd "$B/app" && PYCDSMODE=DUMP PYCDSARCHIVE="$B/app/app.cds" \
    "$B/venv/bin/python" "$B/app/service.py" "$B/app/weights.safetensors" >/dev/null)
"$B/venv/bin/python" -m pycds info "$B/app/app.cds" | sed -n '1,4p;/^modules/p'

# The runtime stage: /opt/venv and /opt/app hold the build stage's files,
# read-only, as user nobody with no home; ENV PYCDSMODE=SHARE.
# The interpreter the venv links to must be readable by nobody, as an
# image's is: one under /root (pyenv's) is mounted at its path on a tmpfs.
PREFIX=$("$PY" -c 'import sys; print(sys.base_prefix)')
runtime() {   # runtime READONLY_ROOT COMMAND...
    ro=$1
    shift
    unshare -m sh -eu -c '
        ro=$1; B=$2; PREFIX=$3; shift 3
        mount -t tmpfs -o mode=755 tmpfs /opt
        mkdir /opt/venv /opt/app /opt/.python
        for d in venv app; do
            mount --bind "$B/$d" "/opt/$d"
            mount -o remount,bind,ro "/opt/$d"
        done
        case $PREFIX in /root/*)
            mount --bind "$PREFIX" /opt/.python
            mount -t tmpfs -o mode=755 tmpfs /root
            mkdir -p "$PREFIX"
            mount --bind /opt/.python "$PREFIX"
        esac
        if [ "$ro" = 1 ]; then
            mount -o remount,bind,ro /
            mount -t tmpfs -o mode=1777 tmpfs /tmp
        fi
        cd /opt/app
        exec setpriv --reuid=65534 --regid=65534 --clear-groups \
            env HOME=/nonexistent "$@"' sh "$ro" "$B" "$PREFIX" "$@"
}
SHARE="PYCDSMODE=SHARE PYCDSARCHIVE=/opt/app/app.cds"     # the image's ENV
BENCH="/opt/venv/bin/python -m pycds bench --reps $REPS --archive /opt/app/app.cds --"
APP="/opt/venv/bin/python /opt/app/service.py /opt/app/weights.safetensors"

say "container: runtime stage (read-only bind mounts at /opt, user nobody)"
runtime 0 env $SHARE PYCDSVERBOSE=1 $APP 2>&1 >/dev/null \
    | grep -c '^\[pycds\] served' | sed 's/^/modules served: /'
runtime 0 $BENCH $APP

# ---- 3. read-only root file system ------------------------------------------
say "read-only root: / read-only, a tmpfs on /tmp (docker run --read-only --tmpfs /tmp)"
runtime 1 env $SHARE PYCDSVERBOSE=1 $APP 2>&1 >/dev/null \
    | grep -c '^\[pycds\] served' | sed 's/^/modules served: /'
runtime 1 $BENCH $APP
say "read-only root: AUTO with an archive that fits writes nothing (stderr follows)"
runtime 1 env PYCDSMODE=AUTO PYCDSARCHIVE=/opt/app/app.cds $APP 2>&1 >/dev/null

# ---- 2. serverless zip --------------------------------------------------------
say "serverless zip: pip install --target, dump, zip; unzip at another path"
L=$W/lambda
mkdir -p "$L/pkg"
"$B/venv/bin/pip" install -q --target "$L/pkg" "$SRC[demo]"
cp "$SRC/examples/service.py" "$B/app/weights.safetensors" "$L/pkg/"
cat > "$L/pkg/lambda_function.py" <<'EOF'
"""A function's handler module, as the runtime imports it at a cold start."""
import os

import pycds
pycds.start()          # PYTHONPATH directories get no .pth processing

import service

APP = service.create_app(os.path.join(os.path.dirname(__file__), "weights.safetensors"))


def handler(event, context):
    with APP.test_client() as client:
        return client.post("/predict", json=event).get_json()
EOF
COLD='import lambda_function as f; print(f.handler({"images": [[[0.5] * 8] * 8]}, None))'
(cd "$L/pkg" && "$PY" -m compileall -q . && PYTHONPATH="$L/pkg" PYCDSMODE=DUMP \
    PYCDSARCHIVE="$L/pkg/function.cds" "$PY" -c "$COLD")
(cd "$L/pkg" && zip -qr "$L/function.zip" .)
ls -l "$L/function.zip" | awk '{print "function.zip:", $5, "bytes"}'
T=$W/var/task
mkdir -p "$T"
unzip -q "$L/function.zip" -d "$T"
(cd "$T" && PYTHONPATH="$T" PYCDSMODE=SHARE PYCDSARCHIVE="$T/function.cds" PYCDSVERBOSE=1 \
    "$PY" -c "$COLD" 2>&1 >/dev/null | grep -c '^\[pycds\] served' | sed 's/^/modules served: /')
(cd "$T" && PYTHONPATH="$T" "$PY" -m pycds bench --reps "$REPS" \
    --archive "$T/function.cds" -- "$PY" -c "$COLD")
