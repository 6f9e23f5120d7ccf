# callfence: every command sets itself up first (scripts/setup.sh is
# idempotent), so a fresh machine needs only Rust, Node 20 and npm.
.PHONY: build build-testing test dev observe demo-call bench model-check drill

## build: the Worker into build/ (index.js, index_bg.wasm), offline
build:
	bash scripts/setup.sh
	bash scripts/build.sh

## build-testing: the Worker with its test and bench scaffolding (the cargo
## feature `testing`) into build-testing/: what the end-to-end tests, drills,
## browser tests and `make bench` run (docs/testing.md)
build-testing:
	bash scripts/setup.sh
	bash scripts/build.sh --testing

## test: formatting, lints, unit, simulation, wasm checks, end-to-end
test:
	bash scripts/test.sh

## dev: the Worker and its Dispatcher locally in workerd, with the example
## documents and the demo nodes M1..M3 (real agents); Ctrl-C stops it
dev:
	bash scripts/dev.sh

## observe: a local Prometheus (Debian's) scraping the running `make dev`
## with the shipped alerting rules (ops/prometheus); prints its URL
observe:
	bash scripts/setup.sh
	node scripts/observe.mjs

## demo-call: a signed sample call to the running `make dev` (optional TO=, FROM=, KEEP=1)
demo-call:
	node scripts/demo-call.mjs $(if $(TO),--to $(TO)) $(if $(FROM),--from $(FROM)) $(if $(KEEP),--keep)

## bench: the benchmarks, with the conditions they ran under
bench:
	bash scripts/bench.sh

## model-check: the exhaustive model check at its default (full) bounds,
## release build; CALLFENCE_MODEL_* variables override each bound
model-check:
	bash scripts/setup.sh
	bash scripts/model-check.sh

## drill: the drills (chaos, failover, canary, replay, rollback, deploy) against the built Worker,
## real agents and a fake Telnyx; NAME=<name> runs one, SHORT=1 the short
## forms, ARGS="--calls=N --rate=R --faults=F --seed=S --scale=X --swaps=N --previous=REV" the
## parameters; each prints a summary and writes .drills/<name>.json
drill: build-testing
	CLOUDFLARE_CF_FETCH_ENABLED=false node scripts/drill.mjs $(NAME) $(if $(SHORT),--short) $(ARGS)
