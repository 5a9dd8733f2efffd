#!/usr/bin/env bash
# The GPU check (issue 31; benchmarks/README.md): dpaudit bench --suite gpu --size gpt2, one JSON
# file, within 8 minutes on one NVIDIA H200. Installs nothing: dpaudit's dependencies must be
# importable by python3 (README: the wheels a lent machine lacks). Writes $OUT/gpu_check.json
# when OUT is set (a lent machine returns the files under $OUT), else ./gpu_check.json.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "${PYTHON:-python3}" -m dpaudit bench --suite gpu --size gpt2 --out "${OUT:+$OUT/}gpu_check.json"
