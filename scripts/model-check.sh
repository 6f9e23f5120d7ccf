#!/usr/bin/env bash
# `make model-check`: the exhaustive model check (core/tests/model) at its
# default bounds (CALLFENCE_MODEL=full), release build. Prints
# `model check: N states, M transitions, depth D, 0 violations` (and the
# map race's `model check (map race): N states, ...`), or the
# shortest counterexample and the command that replays it. Each bound can be
# overridden by its CALLFENCE_MODEL_* variable (docs/testing.md, "Model check").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CALLFENCE_MODEL="${CALLFENCE_MODEL:-full}"
# The bounded scenarios, then the map-change race of SPEC §16 (exhaustive).
cargo test --release -p callfence-core --test model -- --nocapture \
  every_reachable_state_holds_every_invariant the_map_change_race_never_creates_a_session_twice 2>&1 \
  | grep -E '^(model check|  *[0-9]+\. |replay:)'
