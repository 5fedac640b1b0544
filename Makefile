# Two commands on a fresh machine: `make demo` and `make test`. Both install what they need.
VENV   := .venv
PY     := $(VENV)/bin/python
CMAKE  := $(VENV)/bin/cmake
DEPS   := $(VENV)/.deps-installed
JOBS   ?= $(shell nproc)

.PHONY: demo test install cpp cpp-asan cpp-tsan bench bench-peers bench-images format clean

$(DEPS): requirements.txt scripts/system-deps.sh
	bash scripts/system-deps.sh
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $@

# The Python package, built by scikit-build-core (incremental: build/{wheel_tag} is kept).
install: $(DEPS)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pip install -q --no-build-isolation --no-deps .

demo: install
	$(VENV)/bin/stoker demo

# C++ tests: a release build, an ASan/UBSan build and a TSan build.
define cpp_build
	$(CMAKE) -S . -B build/$(1) -G Ninja -DCMAKE_MAKE_PROGRAM=$(CURDIR)/$(VENV)/bin/ninja \
	  -DBUILD_TESTING=ON -DCMAKE_BUILD_TYPE=$(2) -DSTOKER_SANITIZE=$(3) > build/$(1).configure.log
	$(CMAKE) --build build/$(1) -j $(JOBS)
endef

cpp: $(DEPS)
	@mkdir -p build
	$(call cpp_build,cpp,Release,)
cpp-asan: $(DEPS)
	@mkdir -p build
	$(call cpp_build,asan,RelWithDebInfo,address$(,)undefined)
cpp-tsan: $(DEPS)
	@mkdir -p build
	$(call cpp_build,tsan,RelWithDebInfo,thread)

, := ,

test: install cpp cpp-asan cpp-tsan
	$(PY) tools/run_tests.py

bench: install
	$(PY) bench/bench_arrays.py
	$(PY) bench/bench_tune.py
	$(PY) bench/bench_autotune.py

# The peers of bench/bench_images.py, each in its own environment under .venv-peers/ (never .venv).
bench-peers: install
	bash bench/setup_peers.sh

bench-images: bench-peers
	$(PY) bench/bench_images.py

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf build
