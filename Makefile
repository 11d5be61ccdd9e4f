# kaiso: the two commands of the README's quick start, and a few helpers.
#   make demo  - build, create a 3-tier store with an emulated HDD, mount it, run a skewed
#                workload, show promotions and falling latency, unmount and clean up
#   make test  - every test: unit tests, FUSE integration tests, real-server tests
SHELL := /bin/bash
# /usr/sbin and /sbin too: mkfs.ext4, smbd, ganesha.nfsd and rpcbind live there, and a
# runner's PATH may lack them (the tests would then panic or silently skip).
export PATH := $(HOME)/.cargo/bin:$(PATH):/usr/local/sbin:/usr/sbin:/sbin
CARGO ?= cargo

.PHONY: deps build demo test lint bench

deps:
	@scripts/install-deps.sh

build: deps
	$(CARGO) build --release --workspace

demo: build
	scripts/demo.sh

# umask 022: trees that tests create as root are read by "nobody" in some of them,
# whatever umask the runner has.
test: deps
	$(CARGO) build --release --workspace
	umask 022 && $(CARGO) test --release --workspace --no-fail-fast -- --test-threads=2

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
