#!/usr/bin/env bash
# Builds the previous release of the Worker for the rollback drill, once per
# commit, and prints the directory holding its build (index.js,
# index_bg.wasm) on stdout.
#
#   scripts/previous-release.sh [REV]
#
# REV defaults to the revision named in tests/drills/previous-release (the
# last release; bump it when a release lands). The commit's tree is taken
# with `git archive` (nothing is registered in the repository) into
# target/previous-release/<sha>/src and built there with that commit's OWN
# scripts/build.sh, offline (CARGO_NET_OFFLINE), with this repository's
# node_modules linked in. The drill runs it with the CALLFENCE_TEST_* timings,
# so it is built with `--testing`: a release whose build.sh knows the flag
# puts that build in build-testing/, an older one (whose every build had the
# switches) ignores it and builds build/. A finished build is marked with a stamp file and
# never rebuilt; a failed one leaves no stamp.
#
# It builds in a target directory of its own, seeded with a copy of this
# checkout's built dependencies but none of the workspace's own crates. It
# must not share target/: Cargo names a path crate's artifacts by its path
# relative to the workspace root, the same in both trees, so the old
# callfence-core would overwrite the current one there and the next
# `make build` would link it, unrebuilt (seen: "no method named `calls`").
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"

say() { printf 'previous-release: %s\n' "$*" >&2; }
fail() { say "$*"; exit 1; }

rev="${1:-$(tr -d '[:space:]' < tests/drills/previous-release)}"
[[ "$rev" =~ ^[0-9a-f]{7,40}$ ]] || fail "want a commit (7 to 40 hex digits), got ${rev@Q}"
sha="$(git rev-parse --verify --quiet "${rev}^{commit}")" \
  || fail "no commit $rev in this repository (a shallow clone? fetch the full history)"

cache="$root/target/previous-release/$sha"
stamp="$cache/built"
# The directory a finished build of this release is in.
built() {
  local dir
  for dir in "$cache/src/build-testing" "$cache/src/build"; do
    if [[ -f "$dir/index.js" && -f "$dir/index_bg.wasm" ]]; then
      printf '%s\n' "$dir"
      return 0
    fi
  done
  return 1
}

if [[ -f "$stamp" ]]; then
  built
  exit 0
fi

say "building $sha with its own scripts/build.sh (once; cached under ${cache#"$root"/})"
rm -rf "$cache"
mkdir -p "$cache/src"
git archive --format=tar "$sha" | tar -x -C "$cache/src"
[[ -f "$cache/src/scripts/build.sh" ]] || fail "$sha has no scripts/build.sh"
[[ -d "$root/node_modules" ]] || fail "node_modules is missing: run scripts/setup.sh"
ln -s "$root/node_modules" "$cache/src/node_modules"
started=$SECONDS
target="$cache/target"
for dir in release wasm32-unknown-unknown/release; do
  for part in deps build .fingerprint; do
    [[ -d "$root/target/$dir/$part" ]] || continue
    mkdir -p "$target/$dir"
    cp -a "$root/target/$dir/$part" "$target/$dir/"
  done
done
if [[ -d "$target" ]]; then
  find "$target" -mindepth 3 -maxdepth 4 \( -name 'callfence*' -o -name 'libcallfence*' \) -exec rm -rf {} +
fi
(
  cd "$cache/src"
  CARGO_TARGET_DIR="$target" CARGO_NET_OFFLINE=true bash scripts/build.sh --testing
) >&2 || fail "the build of $sha failed (see above)"
rm -rf "$target"
dir="$(built)" || fail "the build of $sha made no index.js and index_bg.wasm"
printf '%s %s\n' "$sha" "$((SECONDS - started))" > "$stamp"
say "built $sha in $((SECONDS - started)) s"
printf '%s\n' "$dir"
