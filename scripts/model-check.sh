#!/usr/bin/env bash
# `make model-check`: the exhaustive model check (core/tests/model) at its
# default bounds (CALLFENCE_MODEL=full), release build. Prints
# `model check: N states, M transitions, depth D, 0 violations`, or the
# shortest counterexample and the command that replays it. Each bound can be
# overridden by its CALLFENCE_MODEL_* variable (docs/testing.md, "Model check").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CALLFENCE_MODEL="${CALLFENCE_MODEL:-full}"
cargo test --release -p callfence-core --test model every_reachable_state_holds_every_invariant -- --nocapture 2>&1 \
  | grep -E '^(model check|  *[0-9]+\. |replay:)'
