#!/usr/bin/env bash
# Installs the npm clients the tests drive, the coding agents Claude Code and Codex and Ollama's
# JavaScript library, each pinned to one exact version, into a cache folder outside the repository,
# so that a rerun downloads nothing. Prints three lines, `claude PATH` and `codex PATH` (the
# runnable binaries) and `ollama-js PATH` (the node_modules folder holding `ollama`).
# Needs Node.js (18+) and npm; each package brings its platform's native binary as an npm
# optionalDependency (about 800 MB together). The cache folder: $SPECGEN_AGENT_CLIENTS, else
# ${XDG_CACHE_HOME:-~/.cache}/specgen/agent-clients.
set -euo pipefail

CLAUDE_CODE_VERSION=2.1.331
CODEX_VERSION=0.169.0
OLLAMA_JS_VERSION=0.6.4
CACHE="${SPECGEN_AGENT_CLIENTS:-${XDG_CACHE_HOME:-$HOME/.cache}/specgen/agent-clients}"

# install PACKAGE VERSION BINARY [NAME]: installs PACKAGE@VERSION once into its own folder under
# $CACHE, then prints "BINARY path"; a library (BINARY "-") prints "NAME node_modules-path".
install() {
    local package=$1 version=$2 binary=$3 name=${4:-}
    local dir="$CACHE/${package//\//+}@$version"
    # The stamp is written last: an interrupted install is done again, never trusted.
    if [[ ! -f "$dir/.installed" ]]; then
        rm -rf "$dir.partial"
        mkdir -p "$dir.partial"
        echo '{"private": true}' > "$dir.partial/package.json"
        # --include=optional: the native binary is an optional dependency, which an npm
        # configured with omit=optional would otherwise leave out.
        npm install --prefix "$dir.partial" --no-audit --no-fund --no-save --loglevel=error \
            --include=optional "$package@$version" >&2
        rm -rf "$dir"
        mv "$dir.partial" "$dir"
        # A missing native package leaves a stub that fails here, not in a test.
        if [[ $binary != - ]]; then "$dir/node_modules/.bin/$binary" --version >&2; fi
        touch "$dir/.installed"
    fi
    if [[ $binary == - ]]; then echo "$name $dir/node_modules"; else echo "$binary $dir/node_modules/.bin/$binary"; fi
}

command -v npm >/dev/null || { echo "install_clients.sh: npm not found (install Node.js 18 or later)" >&2; exit 1; }
install @anthropic-ai/claude-code "$CLAUDE_CODE_VERSION" claude
install @openai/codex "$CODEX_VERSION" codex
install ollama "$OLLAMA_JS_VERSION" - ollama-js
