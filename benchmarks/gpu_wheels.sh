#!/usr/bin/env bash
# Download, on this machine, the Python packages the GPU machine lacks, as wheels for its
# CPython 3.12 on x86-64 Linux, into .whl/ (gitignored). The versions are requirements.lock's.
#
# The GPU machine has PyTorch, numpy, pyarrow, tokenizers, tqdm and pytest but not pydantic,
# which training/config.py needs; nothing can be downloaded there. benchmarks/gpu_check.sh
# installs whatever is in .whl/ with --no-deps into a scratch directory, so every dependency
# is listed here by name. typing_extensions comes too: pydantic 2.14 needs >= 4.16, and the
# machine's own copy may be older.
#
#     benchmarks/gpu_wheels.sh          # then: run(command="bash benchmarks/gpu_check.sh", carry=[".whl"])
set -euo pipefail
cd "$(dirname "$0")/.."
pinned() {  # NAME -> NAME==VERSION as requirements.lock pins it
    local line
    line=$(grep -i -E "^${1//[-_]/[-_]}==" requirements.lock) || { echo "gpu_wheels: $1 is not pinned in requirements.lock" >&2; exit 1; }
    echo "$line"
}
rm -rf .whl
mkdir -p .whl
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl \
    "$(pinned pydantic)" "$(pinned pydantic_core)" "$(pinned annotated-types)" "$(pinned typing-inspection)" \
    "$(pinned typing_extensions)"
ls -1 .whl
du -sh .whl
