#!/usr/bin/env bash
# Installs the Debian packages gemma4rt needs to build and test, plus any named as arguments (the test
# script adds the Vulkan software driver). Idempotent: apt-get runs only for packages that are missing,
# so a second call costs nothing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config xz-utils
  nlohmann-json3-dev libcli11-dev libfmt-dev libcpp-httplib-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nodejs npm
  libopenmpi-dev openmpi-bin
  libvulkan-dev glslc
  "$@"
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

# nodejs from another origin (e.g. NodeSource) already bundles npm; do not ask apt for Debian's npm then.
if command -v npm >/dev/null 2>&1; then
  missing=("${missing[@]/npm}")
fi
if command -v node >/dev/null 2>&1; then
  missing=("${missing[@]/nodejs}")
fi
read -r -a missing <<<"${missing[*]}"

if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
