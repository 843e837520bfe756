# gpu-defrag — the two commands people need are `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

.PHONY: all build demo test lint fmt crds check-crds check-monitoring bench clean help

all: build

help: ## Show the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

build: ## Build every binary (release)
	$(CARGO) build --release --workspace --bins

demo: ## Build, make a fragmented example cluster and report on it
	@bash hack/demo.sh

test: lint check-crds check-monitoring ## Every test: format, lints, unit, property and e2e tests
	$(CARGO) test --workspace --all-targets

lint: ## cargo fmt --check and clippy -D warnings
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt: ## Format the code
	$(CARGO) fmt --all

crds: ## Regenerate crds/defragpolicy.yaml (and its copy for kustomize) from the Rust types
	$(CARGO) run -q -p gpu-defrag-operator -- crd > crds/defragpolicy.yaml.tmp
	mv crds/defragpolicy.yaml.tmp crds/defragpolicy.yaml
	cp crds/defragpolicy.yaml config/crd/defragpolicy.yaml

check-crds: ## Fail when crds/ is stale
	@$(CARGO) run -q -p gpu-defrag-operator -- crd | diff -u crds/defragpolicy.yaml - \
	  || { echo "crds/defragpolicy.yaml is stale: run 'make crds'"; exit 1; }
	@cmp -s crds/defragpolicy.yaml config/crd/defragpolicy.yaml \
	  || { echo "config/crd/defragpolicy.yaml differs from crds/: run 'make crds'"; exit 1; }

check-monitoring: ## promtool check and unit tests of the alert rules (installs Debian's prometheus)
	@bash hack/install-prometheus.sh
	promtool check rules config/prometheus/rules.yaml
	promtool test rules config/prometheus/rules_test.yaml

bench: ## Benchmarks (figures printed; see docs/benchmarks.md)
	@bash hack/bench.sh

clean: ## Remove build output (not the cached Kubernetes binaries)
	$(CARGO) clean

-include e2e/cluster.mk
