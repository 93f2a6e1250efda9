#!/usr/bin/env bash
# The frameworks venv: Megatron-Core, DeepSpeed, torchtitan and Galvatron, so that tools/frameworks/validate.py
# can parse paraplan's exports with each framework's own code (README.md beside this file).
#
#   tools/frameworks/setup.sh [VENV_DIR]     default: .venv-frameworks at the repository root (git-ignored)
#
# Cached: a stamp in the venv records the versions it was built with (constraints.txt, this script, Python);
# when it matches, nothing is done. Otherwise the venv is built anew; pip's own cache keeps that fast after the
# first time. pip only, from the package index (no git, no other downloads). Needs python3 with venv and g++
# (hetu-galvatron is an sdist with a C++ extension).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
VENV="${1:-$ROOT/.venv-frameworks}"
CONSTRAINTS="$HERE/constraints.txt"
PY="${PYTHON:-python3}"

want="$(cat "$CONSTRAINTS" "$0" | sha256sum | cut -d' ' -f1) $("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
stamp="$VENV/.paraplan-frameworks"

mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"        # one build at a time (test sessions may start together)
flock 9
if [[ -x "$VENV/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  echo "setup.sh: $VENV is up to date (cached)"
  exit 0
fi
command -v g++ >/dev/null || { echo "setup.sh: g++ not found (hetu-galvatron builds a C++ extension)" >&2; exit 1; }

t0=$(date +%s)
rm -rf "$VENV"
"$PY" -m venv "$VENV"
PIP=("$VENV/bin/pip" install -q --disable-pip-version-check -c "$CONSTRAINTS")
# torch first and pinned (constraints.txt): 2.13.0 is a CPU build on local disk; an unpinned torch would pull
# GBs of CUDA, and every later install is held to it by the same constraints.
"${PIP[@]}" torch==2.13.0 setuptools wheel
t1=$(date +%s)

# Megatron-Core: the wheel says Python >= 3.12; its training arguments run on 3.11 (typing.override shimmed in
# validate.py). --no-deps: its declared requirements are torch, numpy, packaging. triton (1 GB) is imported
# by megatron.core.transformer.moe at import time; a stub would not do, as torch's own inductor then takes the
# stub for a real triton and fails to import.
"${PIP[@]}" --no-deps --ignore-requires-python megatron-core==0.19.2
"${PIP[@]}" numpy packaging triton typing_extensions
t2=$(date +%s)

# DeepSpeed: an sdist; DS_BUILD_OPS=0 builds no C++/CUDA ops (they would be JIT-built when used, and
# configuration parsing uses none). Its setup.py imports torch: build against the venv's.
DS_BUILD_OPS=0 "${PIP[@]}" --no-build-isolation deepspeed==0.19.8
t3=$(date +%s)

# torchtitan with its declared requirements (held to the venv's torch by the constraints).
"${PIP[@]}" torchtitan==0.3.0
t4=$(date +%s)

# Galvatron 2.4.0: --no-deps, as its declared requirements are the training runtime's (torchvision would drag a
# matching torch, transformers...); its config reader needs numpy, scipy and torch. Builds galvatron_dp_core.
"${PIP[@]}" --no-deps hetu-galvatron==2.4.0
"${PIP[@]}" scipy
t5=$(date +%s)

# smoke test: every validator starts (imports its framework)
for fw in megatron deepspeed torchtitan galvatron; do
  "$VENV/bin/python" "$HERE/validate.py" "$fw" --serve </dev/null 2>"$VENV/smoke-$fw.log" \
    || { echo "setup.sh: the $fw validator does not start:" >&2; tail -20 "$VENV/smoke-$fw.log" >&2; exit 1; }
done
t6=$(date +%s)
echo "$want" >"$stamp"
echo "setup.sh: $VENV built in $((t6 - t0)) s (torch $((t1 - t0)), megatron-core+triton $((t2 - t1)), deepspeed" \
     "$((t3 - t2)), torchtitan $((t4 - t3)), galvatron $((t5 - t4)), smoke test $((t6 - t5))); $(du -sh "$VENV" | cut -f1)"
