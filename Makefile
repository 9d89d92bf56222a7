# The two commands of the README: `make run` and `make test`. Both install what is missing, then build Release.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
MODEL ?= models/tiny-e2b
QUESTION ?= What is the capital of France?

.PHONY: all deps test-deps build run test test-sanitize clean

all: build

deps:
	@bash scripts/install-deps.sh

test-deps: deps
	@bash scripts/install-test-deps.sh

build: deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# The main job: the embedded trained model answers a question through the chat format.
run: build
	./$(BUILD_DIR)/gemma4rt run --model $(MODEL) --chat "$(QUESTION)"

test: test-deps build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# The whole suite under AddressSanitizer and UndefinedBehaviorSanitizer (every finding fatal), in its
# own build folder. Leaks inside OpenMPI's own libraries are suppressed (scripts/sanitizer-suppressions.txt);
# nothing of ours is. Lavapipe is preloaded: the Vulkan loader unloads the driver when an instance is
# destroyed, and the driver's static caches, freed by nobody at unload, would then be reported as leaks
# from an unknown module; kept loaded they stay reachable, and any leak it does report names its frames.
# The tensor-parallel test runs by itself with the slow unwinder (fast_unwind_on_malloc=0): OpenMPI's
# libraries have no frame pointers, and the fast unwinder's stacks through them end before the OpenMPI
# frames the suppressions match. Everything else keeps the fast one (the slow one deadlocks lavapipe).
# Slow: several times the Release suite.
SANITIZE_DIR ?= build-sanitize
LAVAPIPE := $(firstword $(wildcard /usr/lib/*/libvulkan_lvp.so))
SANITIZE_ENV := LD_PRELOAD=$(LAVAPIPE) LSAN_OPTIONS=suppressions=$(CURDIR)/scripts/sanitizer-suppressions.txt \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ASAN_CHECKS := detect_leaks=1:abort_on_error=1:verify_asan_link_order=0
test-sanitize: test-deps
	@cmake -S . -B $(SANITIZE_DIR) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" >/dev/null
	@cmake --build $(SANITIZE_DIR) -j $(JOBS)
	cd $(SANITIZE_DIR) && $(SANITIZE_ENV) ASAN_OPTIONS=$(ASAN_CHECKS) ctest --output-on-failure -j $(JOBS) --timeout 3000 -E mpi_tensor_parallel
	cd $(SANITIZE_DIR) && $(SANITIZE_ENV) ASAN_OPTIONS=$(ASAN_CHECKS):fast_unwind_on_malloc=0 ctest --output-on-failure --timeout 3000 -R mpi_tensor_parallel

clean:
	rm -rf $(BUILD_DIR) $(SANITIZE_DIR)
