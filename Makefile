# The two commands of the README: `make run` and `make test`. Both install what is missing, then build Release.
BUILD_DIR ?= build
JOBS ?= $(shell nproc)
MODEL ?= models/tiny-e2b
QUESTION ?= What is the capital of France?

.PHONY: all deps test-deps build run test clean

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

clean:
	rm -rf $(BUILD_DIR)
