#!/usr/bin/env bash
# Installs the two coding-agent clients the tests drive, Claude Code and Codex, each pinned to one
# exact version, into a cache folder outside the repository, so that a rerun downloads nothing.
# Prints two lines, `claude PATH` and `codex PATH`: the runnable binaries.
# Needs Node.js (18+) and npm; each package brings its platform's native binary as an npm
# optionalDependency (about 800 MB together). The cache folder: $SPECGEN_AGENT_CLIENTS, else
# ${XDG_CACHE_HOME:-~/.cache}/specgen/agent-clients.
set -euo pipefail

CLAUDE_CODE_VERSION=2.1.331
CODEX_VERSION=0.169.0
CACHE="${SPECGEN_AGENT_CLIENTS:-${XDG_CACHE_HOME:-$HOME/.cache}/specgen/agent-clients}"

# install PACKAGE VERSION BINARY: installs PACKAGE@VERSION once into its own folder under $CACHE,
# then prints "BINARY path".
install() {
    local package=$1 version=$2 binary=$3
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
        "$dir/node_modules/.bin/$binary" --version >&2
        touch "$dir/.installed"
    fi
    echo "$binary $dir/node_modules/.bin/$binary"
}

command -v npm >/dev/null || { echo "install_clients.sh: npm not found (install Node.js 18 or later)" >&2; exit 1; }
install @anthropic-ai/claude-code "$CLAUDE_CODE_VERSION" claude
install @openai/codex "$CODEX_VERSION" codex
