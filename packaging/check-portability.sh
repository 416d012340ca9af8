#!/usr/bin/env bash
# Builds the two libraries that load into other people's processes — the shim
# (libsmore_shim.so, LD_PRELOADed into functions) and the C ABI (libsmore.so, linked by
# runtimes) — against an old glibc with cargo-zigbuild, and checks what the loader will see:
#   - no symbol version newer than the floor (objdump -T), so ld.so on Ubuntu 18.04/20.04,
#     RHEL 7/8 loads them (a too-new version makes ld.so ignore an LD_PRELOAD entry silently);
#   - each has its SONAME (libsmore_shim.so, libsmore.so.0).
# docs/shim.md, "Release build and portability". Usage:
#   packaging/check-portability.sh            # dev profile: same symbol versions, fast (CI)
#   packaging/check-portability.sh --release  # the libraries to ship
# Needs cargo-zigbuild and zig: `pip install cargo-zigbuild` (brings the ziglang package).
set -euo pipefail
cd "$(dirname "$0")/.."

FLOOR="${SMORE_GLIBC_FLOOR:-2.17}"
TARGET="x86_64-unknown-linux-gnu.${FLOOR}"
TRIPLE="x86_64-unknown-linux-gnu"
PROFILE_DIR=debug
ARGS=()
if [[ "${1:-}" == "--release" ]]; then
  PROFILE_DIR=release
  ARGS+=(--release)
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/portable}"

if ! command -v cargo-zigbuild >/dev/null 2>&1; then
  echo "check-portability: cargo-zigbuild is not installed: pip install cargo-zigbuild" >&2
  exit 2
fi
cargo zigbuild "${ARGS[@]}" --target "$TARGET" -p smore-shim -p smore-c --lib

newest() { objdump -T "$1" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -1; }
fail=0
for pair in libsmore_shim.so:libsmore_shim.so libsmore.so:libsmore.so.0; do
  file="${pair%%:*}" soname="${pair##*:}"
  lib="$CARGO_TARGET_DIR/$TRIPLE/$PROFILE_DIR/$file"
  v="$(newest "$lib")"
  got="$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')"
  if [[ "$(printf '%s\n%s\n' "$v" "$FLOOR" | sort -V | tail -1)" != "$FLOOR" ]]; then
    echo "FAIL $file needs GLIBC_$v, above the floor $FLOOR:" >&2
    objdump -T "$lib" | grep "GLIBC_$v" >&2
    fail=1
  fi
  if [[ "$got" != "$soname" ]]; then
    echo "FAIL $file has SONAME '${got}', expected '$soname'" >&2
    fail=1
  fi
  [[ $fail == 0 ]] && echo "ok   $lib: newest symbol GLIBC_$v (floor $FLOOR), SONAME $got"
done
exit $fail
