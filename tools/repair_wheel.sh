#!/usr/bin/env bash
# `make wheel`'s second half: auditwheel copies the libraries the extension needs outside the
# manylinux policy (libjpeg, libpng) into stoker.libs/ and tags the wheel with the lowest policy
# its symbols allow. libarrow* / libparquet* are left out: stoker._arrow (stoker[tables]) takes
# them from the pyarrow wheel at run time through its RPATH $ORIGIN/../pyarrow, which the repair
# keeps (it points inside site-packages). Works whether or not the wheel has stoker._arrow.
# Further arguments go to auditwheel (tools/build_wheels.py: --plat manylinux_2_28_x86_64
# --only-plat, the tag it built for, or the repair fails).
# Usage: tools/repair_wheel.sh WHEEL OUT_DIR [AUDITWHEEL_ARGS...]  (auditwheel, patchelf on PATH)
set -euo pipefail
exec auditwheel repair -w "$2" --exclude 'libarrow*' --exclude 'libparquet*' "${@:3}" "$1"
