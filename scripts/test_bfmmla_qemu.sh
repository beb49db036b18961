#!/bin/sh
# Cross-compile the aarch64 BFMMLA sbgemm kernel with its driver and a
# standalone C test, then run it under qemu-user with a CPU that has
# FEAT_BF16 ("-cpu max").  Checks results against a double reference.
#
# Needs (Debian): apt-get install -y gcc-aarch64-linux-gnu qemu-user
# Exit status: 0 pass, 1 test failure, 2 build failure, 77 tools missing.
set -eu

HERE=$(cd "$(dirname "$0")" && pwd)
SRC="$HERE/../native/bf16"
CC=${AARCH64_CC:-aarch64-linux-gnu-gcc}
QEMU=${QEMU_AARCH64:-qemu-aarch64}

for tool in "$CC" "$QEMU"; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "missing tool: $tool (apt-get install -y gcc-aarch64-linux-gnu qemu-user)" >&2
        exit 77
    fi
done

OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# Baseline armv8-a for the driver; BFMMLA code enables +bf16 per function.
if ! "$CC" -O2 -std=c11 -Wall -Wextra -Werror -pthread -static \
        -I"$SRC" \
        "$SRC/test_bfmmla_main.c" "$SRC/bf16_driver.c" "$SRC/bf16_bfmmla.c" \
        "$SRC/bf16_generic.c" \
        -o "$OUT/test_bfmmla" -lm; then
    echo "build failed" >&2
    exit 2
fi

# BFMMLA kernel (detected via HWCAP2_BF16), then the portable C kernel
# through the same driver on aarch64.
"$QEMU" -cpu max "$OUT/test_bfmmla"
"$QEMU" -cpu max "$OUT/test_bfmmla" generic
