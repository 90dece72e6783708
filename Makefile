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
# make test runs the e2e core on the docker backend (the whole of test/e2e runs
# on kfake, and the core on PostgreSQL 16-18); make test-docker runs all of it.
# Tests skipped on the docker backend: none (the harness makes a standby
# container with pg_basebackup; a test that cannot run there, such as a
# cold copy of the data directory, skips itself and says why).
DOCKER_SKIP := ^$$

# Packages that need no PostgreSQL, Kafka or JVM: make check's unit tests.
UNIT_PKGS := . ./wal/... ./router/... ./schema/... ./sink/... ./slot/... ./migrations/... ./pgquote/... ./cmd/outboxd/ ./results/

.PHONY: all build run check test test-short test-docker test-pg-versions test-apache test-tail vet bench bench-inbox soak parity docker clean

all: build

build: ## static binary with version information → bin/outboxd
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/outboxd ./cmd/outboxd

run: ## demo: throwaway PostgreSQL + embedded Kafka + outboxd + sample writes; Ctrl-C (or killing make) removes it all; RUN_ARGS='-http-addr 127.0.0.1:9188' moves the HTTP port (default 9187, or a free one if taken)
	@mkdir -p bin
	@echo "make run: building the demo and outboxd; the first build downloads and compiles the dependencies (a few minutes), each package is listed as it compiles"
	$(GO) build -v -o bin/demo ./test/cmd/demo
	$(GO) build -v -o /dev/null ./cmd/outboxd   # warms the build cache for the demo's own build of outboxd
	bin/demo $(RUN_ARGS)

# staticcheck, pinned as a tool in go.mod.
STATICCHECK ?= $(GO) tool staticcheck

check: vet ## the inner loop (about 2 min on a busy 2-core machine; no PostgreSQL, no Kafka): vet, gofmt, unit tests with -race, then staticcheck over the whole tree
	$(GO) test -count=1 -short -race $(UNIT_PKGS)
	$(GO) test -count=1 ./deploy/
	$(STATICCHECK) ./...

vet: ## go vet and the gofmt check
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

# Tests make test leaves out until they are fixed (run them by name): none.
# TestGapRestoreFromColdCopy was here until 2026-12-02: it kept outboxd out of
# the restored server with CONNECTION LIMIT 0, which walsenders ignore; it
# freezes outboxd now (22 passes in a row on PostgreSQL 15 and 16).
FLAKY :=

# make test runs the unit packages (and the inbox) under the race detector,
# everything else without it.
RACE_PKGS := $(UNIT_PKGS) ./inbox/... ./internal/...
RACE_LIST = $(shell $(GO) list $(RACE_PKGS))
REST_LIST = $(filter-out $(RACE_LIST),$(shell $(GO) list ./...))

test: vet ## unit (with -race), integration, end-to-end (kfake, Apache Kafka, NATS, RabbitMQ, containers; PostgreSQL 15-18), Debezium parity, fault (kfake in both modes, then a 3-node Apache cluster) and alert-rule tests, staticcheck (must stay under 25 min on 2 cores)
	$(STATICCHECK) ./...
	$(GO) test -count=1 -race -timeout 20m $(RACE_LIST)
	$(GO) test -count=1 -timeout 20m -skip '$(FLAKY)' $(REST_LIST)
	@# The Apache runs mostly wait on their JVMs, so 2 cores have room:
	@# the rest of the suite runs beside them, each side's output together.
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-apache test-tail
	bash deploy/check.sh

# test-tail is what make test runs beside test-apache: exactly-once's short
# fault suite on kfake, the e2e core and the harness on the docker backend,
# and the e2e core on PostgreSQL 16-18.
test-tail:
	$(GO) test -count=1 -timeout 10m -run TestFaultsShort ./test/fault/ -mode exactly-once
	OUTBOXD_TEST_BACKEND=docker $(GO) test -count=1 -timeout 10m -run '$(E2E_CORE)' -skip '$(DOCKER_SKIP)$(if $(FLAKY),|$(FLAKY))' ./test/e2e/
	OUTBOXD_TEST_BACKEND=docker $(GO) test -count=1 -timeout 10m ./test/harness/
	$(MAKE) --no-print-directory test-pg-versions

test-docker: ## container tests only: the image, compose, and test/e2e and test/harness on the docker backend
	$(GO) test -count=1 -timeout 20m ./test/docker/ ./test/harness/
	OUTBOXD_TEST_BACKEND=docker $(GO) test -count=1 -timeout 10m -skip '$(DOCKER_SKIP)' ./test/e2e/ ./test/harness/

test-pg-versions: ## the e2e core on PostgreSQL 16, 17 and 18 at once (binaries from .ci/postgres.sh; each version's output together)
	@$(MAKE) --no-print-directory -j$(words $(PG_VERSIONS)) --output-sync=target $(addprefix test-pg-,$(PG_VERSIONS))

test-pg-%:
	@bin=$(PG_CACHE)/pg-$*/bin; \
	test -x $$bin/postgres || { echo "PostgreSQL $* binaries missing in $$bin: run bash .ci/postgres.sh"; exit 1; }; \
	echo "e2e core on PostgreSQL $*"; \
	OUTBOXD_TEST_PG_BIN=$$bin $(GO) test -count=1 -timeout 10m -run '$(E2E_CORE)' -skip '$(FLAKY)' ./test/e2e/

# On the Apache node, make test skips the e2e tests whose subject is PostgreSQL
# or the CLI, not the broker (startup checks, gaps and failover, setup, TLS to
# PostgreSQL, the demo, hostile rows): they run on kfake and on PostgreSQL
# 15-18. make test-apache APACHE_SKIP= runs the whole suite on Apache.
APACHE_SKIP ?= TestStartupCheck|TestPGRestartNoMassResend|TestIgnoreTable|TestStartupRefuses|TestReplicationRoleAlone|TestPostgresTLS|TestMakeRunDemo|TestPGFailover|TestPostgresConnectionLoss|TestGap|TestPostgresShutdown|TestOps|TestPublicationTables|TestREADMEQuickstart|TestSlotFailoverOption|TestSchemaChange|TestSQLInjection|TestEmitMessagePublic|TestHTTPKeepsRowValuesOut|TestStreamNeverStartsBeyondServerWAL|TestConfigFileThreeSchemas|TestRouterOptions|TestTablelessMessages|TestTracing|TestHeaderShadowing|TestHostileSizes|TestIdleOutbox|TestSlotHeldByAnotherProcess|TestStaleOutboxdWalsender|TestHAStandbyTakeover

test-apache: ## only the Apache Kafka runs of make test: e2e on one node (the broker-facing tests: APACHE_SKIP), short fault suite on three
	OUTBOXD_TEST_KAFKA_KIND=apache $(GO) test -count=1 -timeout 20m $(if $(APACHE_SKIP),-skip '$(APACHE_SKIP)') ./test/e2e/
	$(GO) test -count=1 -timeout 20m -run TestFaultsShort ./test/fault/ -kafka apache-cluster

bench: ## throughput/latency/resources beside baselines and Debezium, on kfake, one Apache node and a 3-node cluster; writes results/bench-*.json (~30 min on a busy 2-core machine; BENCH_ARGS='-brokers apache' for one column, BENCH_ARGS='-cases debezium -brokers apache' beside Debezium only; not by default: BENCH_ARGS='-cases tracing -brokers kfake', BENCH_ARGS='-cases sustained -brokers apache-cluster'; beside two CPU hogs: BENCH_ARGS='-hogs 2')
	$(GO) run ./test/cmd/bench -results $(CURDIR)/results $(BENCH_ARGS)

bench-inbox: ## package inbox's effects/s at 1 and 100 events per transaction and with 4 key workers, beside a naive consumer, on Kafka (kfake; OUTBOXD_TEST_KAFKA_KIND=apache for one node), NATS and RabbitMQ in one run; writes results/inbox-bench-*.json (INBOX_BENCH_ARGS='-bench-events 2000 -bench-brokers nats')
	$(GO) test -count=1 -timeout 45m -run 'TestInboxBench$$' ./test/inbox/ -bench-effects -v -results $(CURDIR)/results $(INBOX_BENCH_ARGS)

parity: ## Debezium 3.6 (Kafka Connect) beside outboxd: the full corpus in six converter setups, docs/debezium.md's difference table checked, the cutover, and the Debezium facts README quotes (results/debezium-facts-*.json) (Java; jars from .ci/debezium.sh or fetched on demand)
	$(GO) test -count=1 -timeout 60m -v -run 'TestParity|TestCutover|TestDebeziumFacts' ./test/parity/ -full

# make soak keeps every run's process logs (outboxd, broker), so that a failed
# run can be read afterwards: one folder per run under SOAK_LOGS.
SOAK_LOGS ?= $(or $(TMPDIR),/tmp)/outboxd-soak-logs

soak: ## fault-injection soak under load on kfake and on a 3-node Apache cluster, at-least-once then exactly-once (4 runs of 9-13 min), then the inbox effect soak per broker (Kafka, Kafka with 4 key workers, NATS, RabbitMQ classic, classic with single active consumer, quorum: 6 x 5 min of faults, each then draining its backlog) and on Kafka exactly-once (5 min); writes results/fault-*.json and keeps the process logs under SOAK_LOGS ($$TMPDIR/outboxd-soak-logs)
	$(GO) test -count=1 -timeout 60m -run 'TestSoak' ./test/fault/ -soak -v -results $(CURDIR)/results -keep-logs $(SOAK_LOGS) -mode at-least-once
	$(GO) test -count=1 -timeout 60m -run 'TestSoak' ./test/fault/ -soak -v -results $(CURDIR)/results -keep-logs $(SOAK_LOGS) -mode exactly-once
	$(GO) test -count=1 -timeout 60m -run 'TestSoak' ./test/fault/ -soak -v -results $(CURDIR)/results -keep-logs $(SOAK_LOGS) -mode at-least-once -kafka apache-cluster
	$(GO) test -count=1 -timeout 60m -run 'TestSoak' ./test/fault/ -soak -v -results $(CURDIR)/results -keep-logs $(SOAK_LOGS) -mode exactly-once -kafka apache-cluster
	$(GO) test -count=1 -timeout 150m -run 'TestEffectsExactlyOnce' ./test/inbox/ -soak 5m -v -mode at-least-once
	$(GO) test -count=1 -timeout 30m -run 'TestEffectsExactlyOnce/kafka$$' ./test/inbox/ -soak 5m -v -mode exactly-once

docker: ## container image (needs a Docker engine with BuildKit); DOCKER_BUILD_ARGS="--build-arg BUILDER_IMAGE=..."
	docker build -f deploy/Dockerfile --build-arg VERSION=$(VERSION) $(DOCKER_BUILD_ARGS) -t outboxd:$(VERSION) .

clean:
	rm -rf bin
