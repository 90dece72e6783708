# outboxd — see README.md. Every target works on a fresh machine with Go and
# the PostgreSQL 15 server binaries; .ci/run installs the rest (kcat, promtool).
GO      ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)

.PHONY: all build run test test-short vet bench soak docker clean

all: build

build: ## static binary with version information → bin/outboxd
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/outboxd ./cmd/outboxd

run: ## demo: throwaway PostgreSQL + embedded Kafka + outboxd + sample writes
	$(GO) run ./test/cmd/demo

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

test: vet ## unit, integration, end-to-end and alert-rule tests (< 10 min on 2 cores)
	$(GO) test -count=1 -timeout 20m ./...
	bash deploy/check.sh

bench: ## throughput/latency/resources side by side with baselines (~5 min)
	$(GO) run ./test/cmd/bench

soak: ## fault-injection soak under load, at-least-once then exactly-once (~20 min)
	$(GO) test -count=1 -timeout 60m -run 'TestSoak' ./test/fault/ -soak -v -mode at-least-once
	$(GO) test -count=1 -timeout 60m -run 'TestSoak' ./test/fault/ -soak -v -mode exactly-once

docker: ## container image (needs a Docker engine)
	docker build -f deploy/Dockerfile --build-arg VERSION=$(VERSION) -t outboxd:$(VERSION) .

clean:
	rm -rf bin
