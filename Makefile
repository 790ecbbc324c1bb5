# Tollgate. `make` (or `make help`) lists the targets.
# Needs Go; `make deps` installs redis-server, nginx, caddy, chromium and friends (see scripts/install-deps.sh).

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO           ?= go
PKGS         ?= ./...
TEST_TIMEOUT ?= 20m
TESTFLAGS    ?=
BENCHFLAGS   ?=
BENCHTIME    ?= 2s
# Flags of the EVALSHA ratio run (go run ./loadtest/cmd/evalbench -h).
EVALBENCHFLAGS ?=
# Flags of the key-count sweeps (bin/loadtest sweep -h); the charts go to SWEEPOUT.
SWEEPFLAGS   ?=
SWEEPOUT     ?= docs/img
FUZZTIME     ?= 10s
BIN_DIR      ?= bin
# make test ends with the short chaos soaks (make soak); SOAK=0 skips them.
SOAK         ?= 1
SOAKTIME     ?= 20s
SOAKFLAGS    ?=
# The soaks' fault kinds: all of them (SOAKKINDS=gw-kill,link-cut,... narrows it).
SOAKKINDS    ?= all

# Main packages `make build` builds, each only once its directory holds Go
# files, so the Makefile works before they exist.
MAIN_PKGS     := gateway/cmd/gateway aggregator/cmd/aggregator loadtest/cmd/loadtest loadtest/cmd/sidebyside compose/cmd/tollgate-stack
EXISTING_MAIN := $(foreach p,$(MAIN_PKGS),$(if $(wildcard $(p)/*.go),./$(p)))
# The local stack `make run` starts (docs/local-stack.md).
STACK_PKG     := compose/cmd/tollgate-stack

# Nested Go modules, each with its own go.mod: their heavy dependencies (helm
# and the Kubernetes libraries for the chart's tests) stay out of the module
# the guard's users import. test, lint and tidy-check run in each of them too.
NESTED_MODULES := compose/helm

# Go files gofmt checks: the module's, without testdata, hidden dirs or bin/.
GO_FILES = $(shell find . \( -name testdata -o -name vendor -o -name '.?*' -o -name '_*' -o -path ./$(BIN_DIR) \) -prune -o -name '*.go' -type f -print)

.PHONY: help build test soak deps lint ci bench run traefik fuzz tidy-check clean generate loadtest sidebyside sweep

help: ## List the targets (default)
	@echo "Tollgate make targets:"
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z_-]+:.*## / { printf "  %-11s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)
	@echo "Variables: PKGS=$(PKGS) TEST_TIMEOUT=$(TEST_TIMEOUT) TESTFLAGS= BENCHFLAGS= BENCHTIME=$(BENCHTIME) FUZZTIME=$(FUZZTIME)"

build: ## Compile every package, and the commands that exist into bin/
	$(GO) build $(PKGS)
ifneq ($(strip $(EXISTING_MAIN)),)
	$(GO) build -o $(BIN_DIR)/ $(EXISTING_MAIN)
else
	@echo "build: no commands yet ($(MAIN_PKGS))"
endif

deps: ## Check for redis-server, redis-cli, redis-benchmark, gcc, nginx, caddy, protoc, promtool, prometheus and chromium; install them if root or passwordless sudo
	@scripts/install-deps.sh

test: deps ## Run all tests with the race detector against real servers (runs deps first), then the nested modules' (the Helm chart's), then make soak with fixed seeds (SOAK=0 skips it)
	$(GO) test -race -shuffle=on -count=1 -timeout $(TEST_TIMEOUT) $(TESTFLAGS) $(PKGS)
	@# The nested modules' tests run helm and the Kubernetes types, no
	@# concurrent code of ours: without -race, which would double the
	@# compile of those libraries on a fresh machine.
	@for m in $(NESTED_MODULES); do echo "cd $$m && $(GO) test -shuffle=on -count=1 -timeout $(TEST_TIMEOUT) $(TESTFLAGS) ./..."; \
		(cd $$m && $(GO) test -shuffle=on -count=1 -timeout $(TEST_TIMEOUT) $(TESTFLAGS) ./...) || exit 1; done
ifneq ($(SOAK),0)
	@$(MAKE) --no-print-directory soak SOAKSEED=2
endif

soak: ## The short chaos soaks: the whole fleet under faults, seed 1 then SOAKSEED (random when empty, printed), SOAKTIME=20s of faults each, about 25 s more for start-up, heal and checks (docs/reliability.md)
	@mkdir -p $(BIN_DIR)
	$(GO) build -o $(BIN_DIR)/ ./gateway/cmd/gateway ./aggregator/cmd/aggregator ./loadtest/cmd/loadtest
	$(BIN_DIR)/loadtest chaos -seed 1 -duration $(SOAKTIME) -kinds $(SOAKKINDS) -quiet $(SOAKFLAGS)
	$(BIN_DIR)/loadtest chaos $(if $(SOAKSEED),-seed $(SOAKSEED)) -duration $(SOAKTIME) -kinds $(SOAKKINDS) -quiet $(SOAKFLAGS)

lint: ## gofmt -l must print nothing; go vet
	@unformatted="$$(gofmt -l $(GO_FILES))"; \
	if [ -n "$$unformatted" ]; then echo "gofmt: these files need gofmt -w:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet $(PKGS)
	@for m in $(NESTED_MODULES); do echo "cd $$m && $(GO) vet ./..."; (cd $$m && $(GO) vet ./...) || exit 1; done

tidy-check: ## Fail if go.mod or go.sum is not tidy, here or in a nested module (go mod tidy -diff; changes nothing)
	$(GO) mod tidy -diff
	@for m in $(NESTED_MODULES); do echo "cd $$m && $(GO) mod tidy -diff"; (cd $$m && $(GO) mod tidy -diff) || exit 1; done

ci: lint tidy-check test ## lint, tidy-check and test, as before a merge

bench: deps ## Go benchmarks (-benchmem, BENCHTIME=2s), then the EVALSHA ratio (guard checks ÷ raw EVALSHA); prints a summary
	@mkdir -p $(BIN_DIR)
	$(GO) test -run '^$$' -bench . -benchmem -benchtime=$(BENCHTIME) $(BENCHFLAGS) $(PKGS) | tee $(BIN_DIR)/bench.txt
	$(GO) run ./loadtest/cmd/evalbench $(EVALBENCHFLAGS) | tee $(BIN_DIR)/evalbench.txt
	@echo; echo "== make bench summary (full output: $(BIN_DIR)/bench.txt, $(BIN_DIR)/evalbench.txt) =="
	@awk '/^BenchmarkCheck/ { c = ""; a = ""; for (i = 2; i <= NF; i++) { if ($$i == "checks/s") c = $$(i-1); if ($$i == "allocs/op") a = $$(i-1) } \
		if (c != "") printf "  %-50s %10s checks/s %5s allocs/op\n", $$1, c, a }' $(BIN_DIR)/bench.txt
	@grep '^summary' $(BIN_DIR)/evalbench.txt | sed 's/^/  /'

SCENARIO ?= burst
loadtest: deps ## Replay a scenario: SCENARIO=burst|zipf|hotkey|regions start their own processes; SCENARIO=storm runs against `make run` (bin/stack.env)
	@mkdir -p $(BIN_DIR)
ifeq ($(SCENARIO),storm)
	$(GO) build -o $(BIN_DIR)/ ./loadtest/cmd/loadtest
	@test -f $(BIN_DIR)/stack.env || { echo "loadtest: SCENARIO=storm needs the local stack: run make run in another shell first (see docs/benchmarks.md, Retry storm)"; exit 2; }
	set -a; . $(BIN_DIR)/stack.env; set +a; $(BIN_DIR)/loadtest storm -redis "$$TOLLGATE_REDIS_ADDRS" $(SCENARIOFLAGS)
else
	$(GO) build -o $(BIN_DIR)/ ./gateway/cmd/gateway ./loadtest/cmd/scenario
	$(BIN_DIR)/scenario -scenario $(SCENARIO) -gateway $(BIN_DIR)/gateway $(SCENARIOFLAGS)
endif

sidebyside: deps ## The gateway beside envoyproxy/ratelimit under the same RLS load (scripts/sidebyside.sh; SIDEBYSIDEFLAGS=…)
	scripts/sidebyside.sh $(SIDEBYSIDEFLAGS)

sweep: deps ## How costs grow with keys (1k-10M): gateway CPU, fast path and heap per key, Redis bytes per counter, aggregator events per CPU second, Pebble bytes per row and report latency; tables on stdout, charts into SWEEPOUT=docs/img (SWEEPFLAGS=…; about twenty minutes, most of it 10 M Redis counters)
	@mkdir -p $(BIN_DIR)
	$(GO) build -o $(BIN_DIR)/ ./loadtest/cmd/loadtest
	$(BIN_DIR)/loadtest sweep -out $(SWEEPOUT) $(SWEEPFLAGS)

run: ## Start the local stack in the foreground: Redis, NATS, a Kafka-protocol broker, the aggregator, a demo API and a gateway (Ctrl-C stops it); TOLLGATE_STACK_REGIONS=2 make run starts two regions, linked
	$(GO) build -o $(BIN_DIR)/tollgate-stack ./$(STACK_PKG)
	exec $(BIN_DIR)/tollgate-stack

traefik: deps ## Build Traefik from the Go module proxy into the user's cache (minutes, once), then run the shipped configs/traefik in it; make test runs that test only once it is built
	$(GO) test -race -count=1 -run TestTraefik -v ./compose/forwardauth/ -args -traefik.build

fuzz: ## Run each Fuzz target for FUZZTIME (default 10s)
	@FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh $(PKGS)

clean: ## Remove bin/ and the test cache
	rm -rf $(BIN_DIR)
	$(GO) clean -testcache

# make generate: protoc-gen-go's version is go.mod's google.golang.org/protobuf
# (v1.36.12 today), so the generated code matches the runtime it compiles
# against and the staleness test in schemas/tollgatev1, which builds the plugin
# from the module cache, agrees. module= (not paths=source_relative) puts the
# files where go_package says: source tollgate/v1/*.proto, Go schemas/tollgatev1.
PROTOC_GEN_GO_VERSION = $(shell $(GO) list -m -f '{{.Version}}' google.golang.org/protobuf)
PROTO_FILES = $(sort $(wildcard schemas/proto/tollgate/v1/*.proto))

generate: ## Regenerate schemas/tollgatev1 (Go code, descriptors.binpb) from schemas/proto
	@command -v protoc >/dev/null || { echo "generate: protoc missing: apt-get install -y protobuf-compiler (or make deps)" >&2; exit 1; }
	@if [ "$$($(BIN_DIR)/protoc-gen-go --version 2>/dev/null)" != "protoc-gen-go $(PROTOC_GEN_GO_VERSION)" ]; then \
		echo "GOBIN=$(abspath $(BIN_DIR)) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)"; \
		GOBIN=$(abspath $(BIN_DIR)) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION); fi
	rm -f schemas/tollgatev1/*.pb.go
	protoc --plugin=protoc-gen-go=$(BIN_DIR)/protoc-gen-go -I schemas/proto \
		--go_out=. --go_opt=module=github.com/tollgate/tollgate \
		--descriptor_set_out=schemas/tollgatev1/descriptors.binpb $(PROTO_FILES)
