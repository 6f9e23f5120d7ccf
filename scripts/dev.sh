#!/usr/bin/env bash
# `make dev`: runs the Worker and its Dispatcher locally in workerd.
# TODO(lead): persisted state, example documents from policy/, demo nodes,
# and the printed URLs (SPEC §12). For now: build, then wrangler dev on the
# prebuilt bundle.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
scripts/setup.sh
scripts/build.sh
export WRANGLER_SEND_METRICS=false WRANGLER_HIDE_BANNER=true CLOUDFLARE_CF_FETCH_ENABLED=false
exec node_modules/.bin/wrangler dev --persist-to .dev/state --var ORIGIN_ALLOW_PLAINTEXT:true
