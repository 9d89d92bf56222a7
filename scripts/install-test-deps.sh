#!/usr/bin/env bash
# Installs the npm packages the tests use as oracles (the Jinja engine that renders the published chat
# template, the official OpenAI client). Versions are pinned by tests/e2e/package-lock.json.
set -euo pipefail
cd "$(dirname "$0")/../tests/e2e"
if [ -d node_modules ] && [ node_modules/.package-lock.json -nt package-lock.json ]; then
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
