#!/bin/sh
# scripts/install-deps.sh - install what fiattn's build, tests, lint and fuzzing need on
# Debian 12 (the CUDA toolkit itself is expected in /usr/local/cuda).  Works as root (as in
# most containers, no sudo there) and as a user with sudo.
#   build      build-essential pkg-config libcmocka-dev libjemalloc-dev libgraphviz-dev graphviz
#   make lint  cppcheck
#   make fuzz  clang and libclang-rt-dev (libFuzzer and the sanitizer runtimes: only a
#              Recommends of clang, so --no-install-recommends needs it named)
#   make asan  gcc's libasan / libubsan (build-essential)
set -eu
if [ "$(id -u)" = 0 ]; then
    SUDO=""
elif command -v sudo >/dev/null 2>&1; then
    SUDO=sudo
else
    echo "install-deps.sh: run as root, or install sudo" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends build-essential pkg-config \
    libcmocka-dev libjemalloc-dev libgraphviz-dev graphviz cppcheck clang libclang-rt-dev python3
