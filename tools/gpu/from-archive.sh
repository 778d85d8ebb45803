#!/usr/bin/env bash
# Runs a command in a build tree made from a `git archive` of a commit, so a GPU run builds exactly
# what was committed (the device tool copies the whole working tree, uncommitted edits included).
#   git archive --format=tar HEAD >.deps/head.tar            # on the development machine
#   tools/gpu/from-archive.sh .deps/head.tar DIR COMMAND...  # on the GPU machine (carry .deps/gpu and the tar)
# Files whose content did not change keep their times (a later run rebuilds only what changed);
# files the archive no longer has are removed. DIR/.deps links to this checkout's .deps (the offline
# packages and their unpacked prefix).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TAR="$(realpath "${1:?usage: from-archive.sh ARCHIVE DIR COMMAND...}")"
DIR="${2:?usage: from-archive.sh ARCHIVE DIR COMMAND...}"
shift 2
mkdir -p "$DIR"
python3 - "$TAR" "$DIR" <<'PY'
import os, sys, tarfile
tar, dest = sys.argv[1], sys.argv[2]
keep = set()
with tarfile.open(tar) as t:
    for m in t.getmembers():
        p = os.path.join(dest, m.name)
        keep.add(os.path.normpath(p))
        if m.isdir():
            os.makedirs(p, exist_ok=True)
            continue
        if not m.isfile():
            continue
        data = t.extractfile(m).read()
        try:
            with open(p, "rb") as f:
                if f.read() == data:
                    continue
        except FileNotFoundError:
            pass
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)
        os.chmod(p, m.mode & 0o777)
for top in os.listdir(dest):
    if top in ("build", ".deps"):
        continue
    for base, dirs, files in os.walk(os.path.join(dest, top)):
        for f in files:
            p = os.path.normpath(os.path.join(base, f))
            if p not in keep:
                os.remove(p)
PY
ln -sfn "$ROOT/.deps" "$DIR/.deps"
cd "$DIR"
exec "$@"
