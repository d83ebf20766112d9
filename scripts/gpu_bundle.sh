#!/usr/bin/env bash
# Bundles what raydiff needs beyond a CUDA machine's own Python (one that has torch, numpy,
# pandas, pyarrow, aiohttp, grpcio, scipy, pytest and the like, but no Ray) into
# .gpu/site.tar.xz, for a GPU machine without a network: unpack it into a folder on PYTHONPATH
# there (bench/gpu_check.sh does). The wheels are CPython 3.12 manylinux x86_64 ones, at the
# versions constraints.txt pins. Ray's Java jars and its dashboard's source maps are left out,
# and its binaries' debug sections stripped, to keep the bundle under 50 MB.
#
#   scripts/gpu_bundle.sh            # writes .gpu/site.tar.xz (a few minutes: xz is slow)
set -euo pipefail
cd "$(dirname "$0")/.."

# raydiff's requirements (ray[default,train,tune,data] and what it pulls in) that such a
# machine's Python lacks, plus torch-fidelity (sample quality).
PACKAGES=(
  ray jsonschema jsonschema-specifications referencing rpds-py aiohttp-cors colorful py-spy
  opencensus opencensus-context google-api-core googleapis-common-protos proto-plus google-auth
  pyasn1-modules pyasn1 cryptography cffi pycparser opentelemetry-api opentelemetry-sdk
  opentelemetry-semantic-conventions opentelemetry-exporter-prometheus opentelemetry-proto
  pydantic annotated-types pydantic-core typing-inspection smart-open virtualenv distlib
  platformdirs python-discovery tensorboardx torch-fidelity
)
python="${PYTHON:-.venv/bin/python}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for name in "${PACKAGES[@]}"; do
  pin="$(grep -i -E "^${name//-/[-_.]}==" constraints.txt | head -n 1 || true)"
  if [ -z "$pin" ]; then
    echo "scripts/gpu_bundle.sh: $name has no pin in constraints.txt" >&2
    exit 1
  fi
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$work/wheels" "$pin"
done
mkdir -p "$work/site" .gpu
for wheel in "$work"/wheels/*.whl; do
  unzip -q -o "$wheel" -d "$work/site"
done
rm -rf "$work/site/ray/jars"
find "$work/site" -name '*.js.map' -delete
strip --strip-debug "$work/site/ray/_raylet.so" "$work/site/ray/core/src/ray/gcs/gcs_server" \
  "$work/site/ray/core/src/ray/raylet/raylet"
tar -cJf .gpu/site.tar.xz.part -C "$work/site" .
mv .gpu/site.tar.xz.part .gpu/site.tar.xz
ls -l .gpu/site.tar.xz
