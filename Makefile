# kaiso: the two commands of the README's quick start, and a few helpers.
#   make demo  - build, create a 3-tier store with an emulated HDD, mount it, run a skewed
#                workload, show promotions and falling latency, unmount and clean up
#   make test  - every test: unit tests, FUSE integration tests, real-server tests
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

.PHONY: deps build demo test lint bench

deps:
	@scripts/install-deps.sh

build: deps
	$(CARGO) build --release --workspace

demo: build
	scripts/demo.sh

test: deps
	$(CARGO) build --release --workspace
	$(CARGO) test --release --workspace --no-fail-fast -- --test-threads=2

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
