#!/usr/bin/env bash
# Install the real consumers that tests/consumers feeds qmpprof's output files to:
#   go tool pprof   (Debian's golang-go)           reads .pb.gz
#   chromium        (Debian's chromium, headless)  renders the .svg and runs speedscope's app
#   speedscope      (npm, into tests/consumers/node; its built app reads .speedscope.json)
# Idempotent: installs only what is missing. Needs root or sudo for apt-get.
set -euo pipefail

SPEEDSCOPE_VERSION=1.25.0
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
sudo=""
if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi

missing=""
command -v go >/dev/null 2>&1 || missing="$missing golang-go"
command -v chromium >/dev/null 2>&1 || missing="$missing chromium fonts-dejavu-core"
command -v npm >/dev/null 2>&1 || missing="$missing nodejs npm"
if [ -n "$missing" ]; then
  echo "installing Debian packages:$missing"
  $sudo apt-get update -qq
  # shellcheck disable=SC2086  # one word per package
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    $missing >/dev/null
fi

package="$here/node/node_modules/speedscope/package.json"
if ! grep -q "\"version\": \"$SPEEDSCOPE_VERSION\"" "$package" 2>/dev/null; then
  echo "installing speedscope $SPEEDSCOPE_VERSION from npm into $here/node"
  npm install --prefix "$here/node" --no-save --no-audit --no-fund --loglevel=error \
    "speedscope@$SPEEDSCOPE_VERSION" >/dev/null
fi
