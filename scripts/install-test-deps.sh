#!/usr/bin/env bash
# Installs what the tests need beyond the build: the Vulkan software driver, and the npm packages the tests use as oracles (the Jinja engine that renders the published chat
# template, the official OpenAI client). Versions are pinned by tests/e2e/package-lock.json.
set -euo pipefail
# Mesa's lavapipe: the Vulkan backend's tests run on this software device where no GPU is present.
bash "$(dirname "$0")/install-deps.sh" mesa-vulkan-drivers
cd "$(dirname "$0")/../tests/e2e"
if [ -d node_modules ] && [ node_modules/.package-lock.json -nt package-lock.json ]; then
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
