# Local Kubernetes control plane: build, persistent cluster for people, e2e tests.
# Included from the top-level Makefile; see docs/development.md.
#
#   make cluster-build                 build/cached binaries (e2e/cluster/build.sh)
#   make cluster-up [NODES=8 GPUS=8 GPU_MODEL=NVIDIA-A100-SXM4-80GB]
#   make cluster-status
#   make cluster-down
#   make e2e                           end-to-end tests (one stack per test binary)

NODES ?= 8
GPUS ?= 8
GPU_MODEL ?= NVIDIA-A100-SXM4-80GB
CLUSTER_DIR ?= $(CURDIR)/.cluster
CLUSTER_CLI = cargo run --quiet -p gpu-defrag-e2e --bin gpu-defrag-cluster --

.PHONY: cluster-build cluster-up cluster-down cluster-status e2e

cluster-build: ## Build the local control plane binaries from Go modules (cached; ~30 min cold)
	@e2e/cluster/build.sh >/dev/null

cluster-up: cluster-build ## Start a persistent local cluster in .cluster/ (NODES=8 GPUS=8 GPU_MODEL=...)
	$(CLUSTER_CLI) up --dir "$(CLUSTER_DIR)" --nodes $(NODES) --gpus $(GPUS) --model "$(GPU_MODEL)"

cluster-status: ## Show the local cluster's processes and nodes
	$(CLUSTER_CLI) status --dir "$(CLUSTER_DIR)"

cluster-down: ## Stop the local cluster started by cluster-up
	$(CLUSTER_CLI) down --dir "$(CLUSTER_DIR)"

e2e: cluster-build ## End-to-end tests against real control planes (one per test binary)
	cargo test -p gpu-defrag-e2e
