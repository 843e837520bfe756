# gpu-defrag — the two commands people need are `make demo` and `make test`.
SHELL := /bin/bash
CARGO ?= cargo
export CARGO_TERM_COLOR ?= never

# `make install` puts gpu-defrag and the kubectl plugin (kubectl-gpu_defrag, a link to
# it) into $(DESTDIR)$(BINDIR). Default: ~/.local/bin, no root needed; system-wide:
# `sudo make install PREFIX=/usr/local`.
PREFIX ?= $(HOME)/.local
BINDIR ?= $(PREFIX)/bin
TARGET_DIR ?= $(or $(CARGO_TARGET_DIR),target)

.PHONY: all build demo test test-exact lint fmt crds check-crds check-monitoring bench bench-e2e clean help install uninstall

all: build

help: ## Show the targets
	@grep -hE '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

build: ## Build every binary (release)
	$(CARGO) build --release --workspace --bins

demo: ## Build, make a fragmented example cluster and report on it
	@bash hack/demo.sh

test: lint check-crds check-monitoring ## Every test: format, lints, unit, property and e2e tests
	$(CARGO) test --workspace --all-targets

# Not part of `make test`: the exact optimum's solver (HiGHS) builds from source, about
# 4 minutes on 2 cores; hack/exact-deps.sh installs libclang when it is missing.
test-exact: ## Tests of crates/sim's exact MILP (feature `exact`: builds HiGHS) and its clippy
	@bash hack/exact-deps.sh
	$(CARGO) clippy -p gpu-defrag-sim --all-targets --features exact -- -D warnings
	$(CARGO) test -p gpu-defrag-sim --features exact

lint: ## cargo fmt --check and clippy -D warnings
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt: ## Format the code
	$(CARGO) fmt --all

crds: ## Regenerate crds/defragpolicy.yaml, its copy for kustomize and docs/crd-reference.md from the Rust types
	$(CARGO) run -q -p gpu-defrag-operator -- crd > crds/defragpolicy.yaml.tmp
	mv crds/defragpolicy.yaml.tmp crds/defragpolicy.yaml
	cp crds/defragpolicy.yaml config/crd/defragpolicy.yaml
	$(CARGO) run -q -p gpu-defrag-operator -- crd --reference > docs/crd-reference.md.tmp
	mv docs/crd-reference.md.tmp docs/crd-reference.md

check-crds: ## Fail when crds/ or docs/crd-reference.md is stale
	@$(CARGO) run -q -p gpu-defrag-operator -- crd | diff -u crds/defragpolicy.yaml - \
	  || { echo "crds/defragpolicy.yaml is stale: run 'make crds'"; exit 1; }
	@cmp -s crds/defragpolicy.yaml config/crd/defragpolicy.yaml \
	  || { echo "config/crd/defragpolicy.yaml differs from crds/: run 'make crds'"; exit 1; }
	@$(CARGO) run -q -p gpu-defrag-operator -- crd --reference | diff -u docs/crd-reference.md - \
	  || { echo "docs/crd-reference.md is stale: run 'make crds'"; exit 1; }

install: ## Build (release) and install gpu-defrag and the kubectl plugin into $(BINDIR) (PREFIX=~/.local)
	$(CARGO) build --release -p gpu-defrag-operator --bin gpu-defrag
	install -d "$(DESTDIR)$(BINDIR)"
	install -m 0755 "$(TARGET_DIR)/release/gpu-defrag" "$(DESTDIR)$(BINDIR)/gpu-defrag"
	ln -sf gpu-defrag "$(DESTDIR)$(BINDIR)/kubectl-gpu_defrag"
	@echo "installed $(DESTDIR)$(BINDIR)/gpu-defrag and $(DESTDIR)$(BINDIR)/kubectl-gpu_defrag;"
	@echo "with $(BINDIR) on PATH, 'kubectl gpu-defrag status' works (see 'kubectl plugin list')"

uninstall: ## Remove what `make install` installed from $(BINDIR)
	rm -f "$(DESTDIR)$(BINDIR)/gpu-defrag" "$(DESTDIR)$(BINDIR)/kubectl-gpu_defrag"

check-monitoring: ## promtool check and unit tests of the alert rules (installs Debian's prometheus)
	@bash hack/install-prometheus.sh
	promtool check rules config/prometheus/rules.yaml
	promtool test rules config/prometheus/rules_test.yaml

bench: ## Benchmarks (figures printed; see docs/benchmarks.md)
	@bash hack/bench.sh

bench-e2e: ## The real descheduler and gpu-defrag side by side on the local control plane (docs/benchmarks-e2e.md)
	@bash hack/bench-e2e.sh

clean: ## Remove build output (not the cached Kubernetes binaries)
	$(CARGO) clean

# `make image`: the operator image from the Containerfile with buildah (hack/image.sh; no
# Docker engine, installs Debian's buildah and podman when missing), checked by running its
# `gpu-defrag --version`. BASE=debian-local where no image registry is reachable; see
# docs/install.md. Not part of `make test`.
IMAGE ?= ghcr.io/gpu-defrag/gpu-defrag
TAG ?= $(shell awk '/^\[workspace.package\]/{p=1; next} /^\[/{p=0} p && $$1=="version"{gsub(/"/,"",$$3); print $$3; exit}' Cargo.toml)

.PHONY: image image-push

image: ## Build the operator image $(IMAGE):$(TAG) with buildah and check it runs (BASE=auto|distroless|debian-local)
	IMAGE="$(IMAGE)" TAG="$(TAG)" bash hack/image.sh

image-push: ## Push $(IMAGE):$(TAG) with buildah (log in first: buildah login <registry>)
	IMAGE="$(IMAGE)" TAG="$(TAG)" bash hack/image.sh push

-include e2e/cluster.mk
