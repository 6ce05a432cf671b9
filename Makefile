.DEFAULT_GOAL := help

help: ## List the targets
	@grep -E '^[a-z/]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  %-12s %s\n", $$1, $$2}'

test: ## Run the tests (uses local servers when they answer)
	go test -count=1 ./...

test/race: ## Run the tests with the race detector (what CI runs)
	go test -race -count=1 -timeout 15m ./...

ci: ## Run CI locally: start services, vet, quickstart, tests
	.ci/run

quickstart: ## Run the no-setup quickstart
	go run ./examples/quickstart

lint: ## go vet and gofmt
	go vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)

.PHONY: help test test/race ci quickstart lint
