# outboxd — see README.md. Every target works on a fresh machine with Go and
# the PostgreSQL 15 server binaries; .ci/run installs the rest (kcat, promtool).
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)

.PHONY: all build run test test-short test-apache vet bench soak docker clean

all: build

build: ## static binary with version information → bin/outboxd
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/outboxd ./cmd/outboxd

run: ## demo: throwaway PostgreSQL + embedded Kafka + outboxd + sample writes
	$(GO) run ./test/cmd/demo

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

test: vet ## unit, integration, end-to-end (kfake, then Apache Kafka), fault (kfake, then a 3-node Apache cluster) and alert-rule tests
	$(GO) test -count=1 -timeout 20m ./...
	OUTBOXD_TEST_KAFKA_KIND=apache $(GO) test -count=1 -timeout 20m ./test/e2e/
	$(GO) test -count=1 -timeout 20m -run TestFaultsShort ./test/fault/ -kafka apache-cluster
	bash deploy/check.sh

test-apache: ## only the Apache Kafka runs of make test: e2e on one node, short fault suite on three
	OUTBOXD_TEST_KAFKA_KIND=apache $(GO) test -count=1 -timeout 20m ./test/e2e/
	$(GO) test -count=1 -timeout 20m -run TestFaultsShort ./test/fault/ -kafka apache-cluster

bench: ## throughput/latency/resources side by side with baselines (~5 min)
	$(GO) run ./test/cmd/bench

soak: ## fault-injection soak under load on kfake and on a 3-node Apache cluster, at-least-once then exactly-once
	$(GO) test -count=1 -timeout 60m -run 'TestSoak' ./test/fault/ -soak -v -mode at-least-once
	$(GO) test -count=1 -timeout 60m -run 'TestSoak' ./test/fault/ -soak -v -mode exactly-once
	$(GO) test -count=1 -timeout 60m -run 'TestSoak' ./test/fault/ -soak -v -mode at-least-once -kafka apache-cluster
	$(GO) test -count=1 -timeout 60m -run 'TestSoak' ./test/fault/ -soak -v -mode exactly-once -kafka apache-cluster

docker: ## container image (needs a Docker engine)
	docker build -f deploy/Dockerfile --build-arg VERSION=$(VERSION) -t outboxd:$(VERSION) .

clean:
	rm -rf bin
