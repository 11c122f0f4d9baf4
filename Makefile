# spgate: the two commands a user needs are `make demo` and `make test`.
# Both install whatever Debian packages are missing first (sudo when not root).

BUILD_DIR ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

# Debian 12 packages, by purpose. `make deps` installs them all (a developer's machine,
# CI); `make build` and `make demo` install all but the image's (`deps-dev`), `make test`
# those too (its image test needs them); the image's build stage runs `make deps-build`
# and gets only the first list.
#   build: compiling spgated, spgatectl and spgate-sim (the image's build stage);
#   test:  the rest of the tree (worker runtime, Python module, benchmarks) and the suite
#          (which installs the Python package with pip into a virtualenv and tests that);
#   demo:  `make demo`, `make torch-demo`, `make bench` beyond that;
#   image: `make image` and the image test (podman from Debian, base images made with
#          debootstrap; runc, iptables and uidmap for podman on this VM kind).
DEB_BUILD_PACKAGES := build-essential cmake pkg-config python3 \
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler \
  libabsl-dev prometheus-cpp-dev libssl-dev libopenblas-dev
DEB_TEST_PACKAGES := git ca-certificates libgtest-dev libgmock-dev libbenchmark-dev \
  libopenmpi-dev openmpi-bin prometheus python3-grpcio python3-protobuf python3-yaml \
  openssl python3-torch pybind11-dev python3-dev python3-matplotlib python3-numpy python3-venv \
  python3-pip systemd \
  universal-ctags
DEB_DEMO_PACKAGES := curl
DEB_IMAGE_PACKAGES := podman runc netavark aardvark-dns iptables uidmap debootstrap
DEB_PACKAGES := $(DEB_BUILD_PACKAGES) $(DEB_TEST_PACKAGES) $(DEB_DEMO_PACKAGES) \
  $(DEB_IMAGE_PACKAGES)

.PHONY: all deps deps-build deps-dev deps-image image build test test-asan test-asan-mpi \
  test-tsan demo torch-demo bench clean

all: build

# install_missing(PACKAGES): apt-get install whichever are not installed yet.
define install_missing
	@missing=$$(for p in $(1); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing $$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	else echo "make deps: all packages present"; fi
endef

deps:
	$(call install_missing,$(DEB_PACKAGES))

deps-build:
	$(call install_missing,$(DEB_BUILD_PACKAGES))

deps-dev:
	$(call install_missing,$(DEB_BUILD_PACKAGES) $(DEB_TEST_PACKAGES) $(DEB_DEMO_PACKAGES))

deps-image:
	$(call install_missing,$(DEB_IMAGE_PACKAGES))

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) $(CMAKE_FLAGS)

build: deps-dev $(BUILD_DIR)/CMakeCache.txt
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	@$(MAKE) --no-print-directory deps-image   # after deps-dev: one apt-get at a time
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# Sanitizer builds of the suite (separate build trees, no CUDA, no benchmarks).
# ASan+UBSan runs every test but the GPU ones, the deploy checks (Python and promtool
# only), the benchmark drivers' checks (label `bench`: Python arithmetic over
# simulator runs that sim_test already covers) and the Python package's tests (label
# `python`: in a sanitizer tree only the pure-Python ones are registered — the native
# module is not built there — and they load nothing instrumented); `make test-asan` leaves out the
# multi-rank MPI ones too, which `make test-asan-mpi` then runs one at a time with leak
# checking off (OpenMPI's own allocations in its dlopen'd components show up as
# unsymbolizable leaks; the ASan ranks still check every access). The fault and adversarial campaigns (label `faults`)
# run in `make test` only: they hold timings (the decision deadline, the reconnect bound)
# and an RSS bound that ASan's slowdown and shadow memory would break; their paths run
# under ASan in worker_daemon_kill_test, daemon_test, gate_state_test and the fuzz
# replays. CI runs test-asan-mpi. TSan runs the tests labelled
# `tsan` (the daemon's and the client's concurrent paths) with suppressions scoped to
# uninstrumented Debian libraries.
#
# CI time (.ci/run on a 2-core machine: make test, test-tsan, test-asan-mpi; with the
# image-layer cut at the end of this comment runs passed in 2,320 and 2,664 s, and in
# 2,058 s with the unity builds too, against an aim of 2,400 s; docs/reliability.md,
# "CI time", has the figures):
# the three builds and the image test run alone are most of it, so the sanitizer trees
#   - build as unity builds (CMAKE_UNITY_BUILD, 8 sources a unit; protoc's sources and
#     policy_test stay out, their file-local names collide): each unit parses the gRPC,
#     protobuf and Abseil headers once for eight files, -31 % compile CPU measured on the
#     TSan target set. The main tree is not one: it is the build users run;
#   - compile at -O1 with line tables only (-g1): every report still has file:line
#     stacks, for about half the compile CPU of -O2 -g and half the object size (ASan's
#     own advice is -O1);
#   - TSan builds only what its tests run (target tests_tsan: the binaries labelled
#     `tsan` and what they link and depend on), not the kernels, the worker runtime,
#     spgatectl, spgate-worker and the other tests of its folders;
#   - ASan replays each fuzz corpus with 20,000 deterministic mutations instead of the
#     200,000 of `make test` (which still runs them all, uninstrumented); the long
#     libFuzzer runs under ASan/UBSan are bench/fuzz.sh.
# .ci/run also builds the main tree with line tables only (CMAKE_FLAGS, -O2 -g1 for
# -O2 -g), and makes the image test's base images and build-stage package layers in the
# background while that tree compiles (the test's build takes them from podman's cache:
# ~57 + ~136 s that ran alone before). Every test that ran in a suite before still runs
# in it.
SAN_BUILD := -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"
SAN_FLAGS := -DSPGATE_ENABLE_CUDA=OFF -DSPGATE_BUILD_BENCH=OFF -DCMAKE_UNITY_BUILD=ON $(SAN_BUILD)

test-asan: deps
	cmake -S . -B build-asan $(SAN_FLAGS) -DSPGATE_SANITIZE=address,undefined \
	  -DSPGATE_FUZZ_REPLAY_MUTATIONS=20000
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) -LE 'gpu|deploy|mpi|faults|bench|python'

test-asan-mpi: test-asan
	cd build-asan && ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --output-on-failure -j 1 -L mpi -LE faults --timeout 900

test-tsan: deps
	cmake -S . -B build-tsan $(SAN_FLAGS) -DSPGATE_SANITIZE=thread -DSPGATE_TEST_DIRS="server;worker;tools"
	cmake --build build-tsan -j $(JOBS) --target tests_tsan
	cd build-tsan && TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp halt_on_error=1 second_deadlock_stack=1" \
	  ctest --output-on-failure -j $(JOBS) -L tsan

# The container image (deploy/docker/Dockerfile): docker when its daemon answers, else
# podman from Debian; base images made locally when no registry is reachable. Tagged
# $(IMAGE):<spgated --version> (docs/deploy.md, "The container image").
IMAGE ?= ghcr.io/spgate/spgate
image:
	@if ! (command -v docker >/dev/null && docker info >/dev/null 2>&1); then \
	  $(MAKE) --no-print-directory deps-image; fi
	IMAGE=$(IMAGE) bash tools/image/build_image.sh

demo: build
	bash tools/demo.sh $(BUILD_DIR)

# The same job in PyTorch: examples/torch/train.py (4 processes, 2 TP groups of 2, gloo)
# against a spgated it starts on loopback (docs/pytorch.md).
torch-demo: build
	bash examples/torch/demo.sh $(BUILD_DIR)

bench: build
	bash bench/run_all.sh $(BUILD_DIR)

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan build-pip
