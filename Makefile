# outboxd — see README.md. Every target works on a fresh machine with Go and
# the PostgreSQL 15 server binaries; .ci/run installs the rest (kcat, promtool).
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
# PostgreSQL 16-18 server binaries, fetched by .ci/postgres.sh; 15 is the system's.
PG_CACHE    ?= $(or $(OUTBOXD_PG_CACHE),$(if $(filter 0,$(shell id -u)),/var/cache/outboxd,$(HOME)/.cache/outboxd))
PG_VERSIONS ?= 16 17 18
# The e2e core that runs on every PostgreSQL version (the full suite runs on 15).
E2E_CORE    := TestStartupCheck|TestSlotHeldByAnotherProcess|TestRoutingAndSkippedOperations|TestOrderPerAggregate|TestGracefulShutdownConfirmsEverything|TestBrokerDownHoldsSlot|TestKillDuringStreamLosesNothing|TestPostgresConnectionLoss|TestIdleOutboxDoesNotPinWAL|TestOpsStatus|TestHA|TestPGFailover|TestSlotFailoverOption|TestGap
# Tests skipped on the docker backend: none (the harness makes a standby
# container with pg_basebackup; a test that cannot run there, such as a
# cold copy of the data directory, skips itself and says why).
DOCKER_SKIP := ^$$

.PHONY: all build run test test-short test-docker test-pg-versions test-apache vet bench soak parity docker clean

all: build

build: ## static binary with version information → bin/outboxd
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/outboxd ./cmd/outboxd

run: ## demo: throwaway PostgreSQL + embedded Kafka + outboxd + sample writes
	$(GO) run ./test/cmd/demo

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

test: vet ## unit, integration, end-to-end (kfake, Apache Kafka, containers; PostgreSQL 15-18), Debezium parity, fault (kfake in both modes, then a 3-node Apache cluster) and alert-rule tests (about 17 min on 2 cores)
	$(GO) test -count=1 -timeout 20m ./...
	$(GO) test -count=1 -timeout 10m -run TestFaultsShort ./test/fault/ -mode exactly-once
	$(MAKE) --no-print-directory test-apache
	OUTBOXD_TEST_BACKEND=docker $(GO) test -count=1 -timeout 10m -skip '$(DOCKER_SKIP)' ./test/e2e/ ./test/harness/
	$(MAKE) --no-print-directory test-pg-versions
	bash deploy/check.sh

test-docker: ## container tests only: the image, compose, and test/e2e and test/harness on the docker backend
	$(GO) test -count=1 -timeout 20m ./test/docker/ ./test/harness/
	OUTBOXD_TEST_BACKEND=docker $(GO) test -count=1 -timeout 10m -skip '$(DOCKER_SKIP)' ./test/e2e/ ./test/harness/

test-pg-versions: ## the e2e core on PostgreSQL 16, 17 and 18 (binaries from .ci/postgres.sh)
	@for v in $(PG_VERSIONS); do \
	  bin=$(PG_CACHE)/pg-$$v/bin; \
	  test -x $$bin/postgres || { echo "PostgreSQL $$v binaries missing in $$bin: run bash .ci/postgres.sh"; exit 1; }; \
	  echo "e2e core on PostgreSQL $$v"; \
	  OUTBOXD_TEST_PG_BIN=$$bin $(GO) test -count=1 -timeout 10m -run '$(E2E_CORE)' ./test/e2e/ || exit 1; \
	done

test-apache: ## only the Apache Kafka runs of make test: e2e on one node, short fault suite on three
	OUTBOXD_TEST_KAFKA_KIND=apache $(GO) test -count=1 -timeout 20m ./test/e2e/
	$(GO) test -count=1 -timeout 20m -run TestFaultsShort ./test/fault/ -kafka apache-cluster

bench: ## throughput/latency/resources beside baselines and Debezium, on kfake, one Apache node and a 3-node cluster (~30 min on a busy 2-core machine; BENCH_ARGS='-brokers apache' for one column, BENCH_ARGS='-cases debezium -brokers apache' beside Debezium only)
	$(GO) run ./test/cmd/bench $(BENCH_ARGS)

parity: ## Debezium 3.6 (Kafka Connect) beside outboxd: the full corpus in three converter setups, README's difference table checked, and the cutover (Java; jars from .ci/debezium.sh or fetched on demand)
	$(GO) test -count=1 -timeout 30m -v -run 'TestParity|TestCutover' ./test/parity/ -full

soak: ## fault-injection soak under load on kfake and on a 3-node Apache cluster, at-least-once then exactly-once (4 runs of 10-12 min)
	$(GO) test -count=1 -timeout 60m -run 'TestSoak' ./test/fault/ -soak -v -mode at-least-once
	$(GO) test -count=1 -timeout 60m -run 'TestSoak' ./test/fault/ -soak -v -mode exactly-once
	$(GO) test -count=1 -timeout 60m -run 'TestSoak' ./test/fault/ -soak -v -mode at-least-once -kafka apache-cluster
	$(GO) test -count=1 -timeout 60m -run 'TestSoak' ./test/fault/ -soak -v -mode exactly-once -kafka apache-cluster

docker: ## container image (needs a Docker engine with BuildKit); DOCKER_BUILD_ARGS="--build-arg BUILDER_IMAGE=..."
	docker build -f deploy/Dockerfile --build-arg VERSION=$(VERSION) $(DOCKER_BUILD_ARGS) -t outboxd:$(VERSION) .

clean:
	rm -rf bin
