# callfence: every command sets itself up first (scripts/setup.sh is
# idempotent), so a fresh machine needs only Rust, Node 20 and npm.
.PHONY: build test dev bench

## build: the Worker into build/ (index.js, index_bg.wasm), offline
build:
	bash scripts/setup.sh
	bash scripts/build.sh

## test: formatting, lints, unit, simulation, wasm checks, end-to-end
test:
	bash scripts/test.sh

## dev: the Worker and its Dispatcher locally in workerd
dev:
	bash scripts/dev.sh

## bench: the benchmarks, with the conditions they ran under
bench:
	bash scripts/bench.sh
