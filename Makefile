# Everyday entry points.  `make test` from a fresh clone sets everything up first.
#   make setup | test [PYTEST_ARGS=...] | test-portability | test-asan | fuzz [FUZZ_SECONDS=...]
#   | serve [HOST=... PORT=...] | bench [DRIVER=swiftshader] | images [IMAGES=cpu|gpu] | clean
SHELL := bash
# Same knob as scripts/setup.sh: VKACT_VENV=/path make test
VKACT_VENV ?= $(CURDIR)/.venv
export VKACT_VENV
VENV  := $(VKACT_VENV)
PY    := $(VENV)/bin/python

# The set-up is idempotent but still costs a few seconds of checks; this stamp lets test/serve/
# bench skip it until something that affects the environment changes.
STAMP := $(VENV)/.make-setup-stamp
$(STAMP): pyproject.toml scripts/setup.sh scripts/build-kp.sh scripts/build-native.sh $(wildcard service/native/h2grpc* service/native/h1http*)
	bash scripts/setup.sh
	touch $@

.PHONY: setup shaders test test-portability test-asan fuzz serve bench images clean
setup:            # explicit request: always run the (idempotent) script
	bash scripts/setup.sh
	touch $(STAMP)

# Compile every kernel variant into the content-hashed SPIR-V cache: a shader that does not compile
# stops here with glslang's message, before any test or request.
shaders: $(STAMP)
	$(PY) -m service.shaders

test: shaders
	$(PY) -m pytest -q $(PYTEST_ARGS)

# lavapipe and SwiftShader under the Khronos validation layer (sync validation on), both memory modes;
# writes README's "Tested on" table from what ran (scripts/test-portability.sh says which tests where).
test-portability: shaders
	bash scripts/test-portability.sh $(PYTEST_ARGS)

# The tests of service/native's C (gRPC, HTTP/1.1) against its AddressSanitizer + UBSan build (scripts/test-asan.sh).
test-asan: shaders
	bash scripts/test-asan.sh $(PYTEST_ARGS)

# The libFuzzer targets of service/native (fuzz/: h2grpc, h1http): FUZZ_SECONDS each (default 60), on their seeds.
fuzz: $(STAMP)
	bash scripts/fuzz.sh $(FUZZ_SECONDS)

# HOST/PORT are passed only when given, so the service's own defaults apply otherwise.
serve: shaders
	$(if $(HOST),VKACT_HOST=$(HOST)) $(if $(PORT),VKACT_PORT=$(PORT)) $(PY) -m service

# DRIVER=swiftshader (or lavapipe): that Vulkan driver's own sections of bench/RESULTS.md
# The bench extra (IREE, ncnn, wgpu: the Vulkan peers of the kernels and graphs) is installed here only:
# the tests do not need it.
bench: shaders
	$(PY) -m pip install -q -e '.[service,test,bench]'
	$(PY) -m bench $(if $(DRIVER),--driver $(DRIVER))

# Both service images, vkact:cpu and vkact:gpu (IMAGES=cpu for one), from docker/Dockerfile with docker
# or podman, whichever is here; needs no venv (scripts/build-images.sh).
images:
	bash scripts/build-images.sh $(IMAGES)

# The kp wheel cache (~/.cache/vkact) stays: it is outside the repo and shared by clones.
clean:
	rm -rf $(VENV) .cache
