#!/usr/bin/env bash
# Installs XLA's CPU PJRT plugin (the PyPI package lammps-jax-pjrt-cpu 0.11.2, PJRT C API 0.115)
# into the project-local, git-ignored folder .pjrt/, links it as .pjrt/plugins/xla-cpu.so where
# tpu-rs looks for plugins, and prints the plugin's path. Running it again changes nothing.
set -euo pipefail

package="lammps-jax-pjrt-cpu==0.11.2"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$root/.pjrt/cpu"
plugin="$dest/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so"

if [ ! -s "$plugin" ]; then
    python3 -m pip install --quiet --no-deps --disable-pip-version-check --root-user-action=ignore \
        --target "$dest" --upgrade "$package" >&2
fi
if [ ! -s "$plugin" ]; then
    echo "install-pjrt-cpu: $package installed, but $plugin is missing" >&2
    exit 1
fi

mkdir -p "$root/.pjrt/plugins"
ln -sfn "../cpu/lammps_jax_pjrt_cpu/pjrt_c_api_cpu_plugin.so" "$root/.pjrt/plugins/xla-cpu.so"
echo "$plugin"
