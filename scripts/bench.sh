#!/usr/bin/env bash
# `make bench`: the benchmarks, with the conditions they were taken under.
# TODO(lead): the Worker end-to-end figures (Miniflare) next to the core's.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
printf 'bench: %s, %s cores, %s\n' "$(uname -srm)" "$(nproc)" "$(rustc --version)"
cargo bench -p callfence-core
