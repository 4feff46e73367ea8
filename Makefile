# xmx: build, test and demo. Everything that needs the network (AF_XDP, BPF,
# namespaces) needs root: run `sudo make demo` and `sudo make test`.

GO      ?= $(shell command -v go || echo /usr/local/go/bin/go)
export PATH := $(dir $(GO)):$(PATH)
# No version-control stamp in binaries (nothing reads it): as root in a
# clone owned by another user (sudo make ...), git refuses the repository
# and go build would fail on the stamp. The tests' own builds inherit it.
export GOFLAGS := -buildvcs=false $(GOFLAGS)

# Debian packages the tests and the lab use: ip and tc (netem), ping,
# sysctl, and a C compiler (go test -race needs cgo).
DEB_PKGS := iproute2 iputils-ping procps gcc libc6-dev
# Debian packages needed only to regenerate the BPF object (make generate).
DEB_GEN  := clang llvm libbpf-dev

.PHONY: all build test demo bench generate deps deps-generate fmt-check vet clean

all: build

build:
	$(GO) build -o bin/xmx ./cmd/xmx

# Install what a fresh Debian machine lacks (as root); a no-op when present.
deps:
	@scripts/debdeps $(DEB_PKGS)
	$(GO) mod download

deps-generate:
	@scripts/debdeps $(DEB_GEN)

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi

vet:
	@# go.mod and go.sum say exactly what the build and its tests use.
	$(GO) mod tidy -diff
	$(GO) vet ./...
	$(GO) vet -tags xmxtrace ./xdp ./msglayer ./internal/...

# The whole suite, privileged tests included (they skip without root unless
# XMX_REQUIRE_PRIVILEGED=1, which turns a skip into a failure).
test: deps fmt-check vet
	$(GO) test -race -count=1 -timeout 20m ./...
	@# Every benchmark once (about 15 s), so that a change that breaks one
	@# shows here; no figure is checked.
	$(GO) test -run XXX -bench . -benchtime 1x -timeout 10m ./...

# The first thing to run: a two-host veth lab, an msglayer ping-pong sweep
# and a stream through it, the raw link floor beside, everything torn down.
demo: deps build
	scripts/demo

# The full link benchmark (interleaved rounds, the asavie/xdp floor beside).
bench: deps build
	./bin/xmx linkbench -rounds 5 -n 20000

# Regenerate the BPF object and its Go bindings (needs clang).
generate: deps-generate
	$(GO) generate ./bpf

clean:
	rm -rf bin
