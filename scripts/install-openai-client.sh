#!/usr/bin/env bash
# Installs the official OpenAI Python client (pinned) into a project-local, git-ignored virtual
# environment, .venv-openai/, for the server's client test. Running it again changes nothing.
# Prints the environment's Python, to be given to the test as TPU_RS_OPENAI_PYTHON.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv-openai"
version="3.60.0"

if ! "$venv/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$version')" \
    2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv" >&2
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "openai==$version" >&2
fi
echo "$venv/bin/python"
