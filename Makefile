# Two commands on a fresh machine: `make demo` and `make test`. Both install what they need.
# `make check` is the edit-test loop: the release C++ tests and the Python tests not marked slow.
VENV   := .venv
PY     := $(VENV)/bin/python
CMAKE  := $(VENV)/bin/cmake
DEPS   := $(VENV)/.deps-installed
JOBS   ?= $(shell nproc)
# Every build compiles through ccache where installed: `make test`'s second compile of the engine
# with the same flags (install then cpp, cpp-asan then ext-asan) is then a cache hit (the script
# says how).
LAUNCHER := $(CURDIR)/tools/ccache.sh
LAUNCH   := -DCMAKE_CXX_COMPILER_LAUNCHER=$(LAUNCHER)

.PHONY: demo test check install wheel wheels wheels-test bench-wheels sdist cpp cpp-asan cpp-tsan fuzz-build fuzz ext-asan bench bench-peers bench-images soak format clean

$(DEPS): requirements.txt requirements-lerobot.txt scripts/system-deps.sh
	bash scripts/system-deps.sh
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps --upgrade --target $(VENV)/lerobot -r requirements-lerobot.txt
	touch $@

# The Python package, built by scikit-build-core (incremental: build/{wheel_tag} is kept). The
# wings are named ON (each is built where its libraries are found): `make wheel` turns three of
# them OFF in the same build directory, and CMake's cache would otherwise keep them off here.
WINGS_ON := $(foreach w,VIDEO TEXT AUDIO,-C cmake.define.STOKER_$(w)_WING=ON)
install: $(DEPS)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pip install -q --no-build-isolation --no-deps \
	  -C cmake.define.STOKER_TESTING=ON $(WINGS_ON) \
	  -C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=$(LAUNCHER) .

demo: install
	$(VENV)/bin/stoker demo

# The self-contained wheel, dist/stoker-<version>-<tag>.whl: built in install's build directory
# (the same options but STOKER_TESTING: one file recompiled and a relink, not a rebuild), then
# tools/repair_wheel.sh (auditwheel) bundles libjpeg and libpng and tags it manylinux. Without the
# video module: it would link (and the repair bundle) this system's GPL build of FFmpeg. Without
# the text module (stoker.Tokenizer) too: the wheels do not bundle PCRE2, utf8proc, simdjson yet.
# Nor the audio module (stoker.AudioDataset), for the video module's reason (`make wheels` builds
# an LGPL FFmpeg, libswresample with soxr, and bundles it for both).
# docs/install.md says what it holds and how to go lower.
wheel: $(DEPS)
	rm -rf build/wheel && mkdir -p dist && rm -f dist/stoker-*.whl
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pip wheel -q --no-build-isolation --no-deps \
	  -C cmake.define.STOKER_TESTING=OFF -C cmake.define.STOKER_VIDEO_WING=OFF \
	  -C cmake.define.STOKER_TEXT_WING=OFF -C cmake.define.STOKER_AUDIO_WING=OFF \
	  -C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=$(LAUNCHER) -w build/wheel .
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH tools/repair_wheel.sh build/wheel/stoker-*.whl dist

# Every wheel this machine can build honestly, into dist/ (replacing what is there): cp310-cp310,
# cp311-cp311 and one cp312-abi3 for every CPython from 3.12 on, each manylinux_2_28 (zig's clang
# for glibc 2.28, libjpeg-turbo and libpng built from Debian's sources the same way, and an LGPL
# FFmpeg with dav1d and libsoxr for the video and audio modules). A CPython
# not found on this machine is named and its wheel skipped. scripts/wheel-deps.sh installs what
# it needs (nasm, a deb-src entry); zig comes from PyPI into build/wheels/venv-tools. Not part of
# `make test` (a full compile per wheel); docs/install.md says what it covers.
wheels: $(DEPS)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) tools/build_wheels.py --out dist

# Each wheel of dist/ in a clean room of every interpreter found for it (tools/clean_room.py),
# with and without [tables]. `make test` does this for its own wheel (tests/python/test_wheel.py).
wheels-test: $(DEPS)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) tools/build_wheels.py --test --out dist

# The shipped build (`make wheels`: zig, manylinux_2_28) against the GCC build (`make wheel`'s,
# manylinux_2_34), same CPython, each in a clean venv: the image pipeline and token windows,
# interleaved repeats (bench/bench_wheels.py).
bench-wheels: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) tools/build_wheels.py --toolchain gcc --only cp311 \
	  --out build/wheels/dist-gcc
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) tools/build_wheels.py --only cp311 \
	  --out build/wheels/dist-zig
	$(PY) bench/bench_wheels.py build/wheels/dist-gcc/stoker-*.whl build/wheels/dist-zig/stoker-*.whl

# dist/stoker-<version>.tar.gz: builds with `pip install stoker-<version>.tar.gz` given a C++20
# compiler, Python's headers and the libjpeg/libpng headers (docs/install.md).
sdist: $(DEPS)
	mkdir -p dist && rm -f dist/stoker-*.tar.gz
	$(PY) -m build --sdist -o dist .

# C++ tests: a release build, an ASan/UBSan build and a TSan build (the tests of the wings that
# run threads of their own: CMakeLists.txt's STOKER_TEST_WINGS).
define cpp_build
	$(CMAKE) -S . -B build/$(1) -G Ninja -DCMAKE_MAKE_PROGRAM=$(CURDIR)/$(VENV)/bin/ninja $(LAUNCH) \
	  -DBUILD_TESTING=ON -DCMAKE_BUILD_TYPE=$(2) -DSTOKER_SANITIZE=$(3) \
	  -DSTOKER_TEST_WINGS="$(4)" > build/$(1).configure.log
	$(CMAKE) --build build/$(1) -j $(JOBS)
endef
TSAN_WINGS := engine;sources;pydata;tuning;tables;text;image_text;gpu;cuda

cpp: $(DEPS)
	@mkdir -p build
	$(call cpp_build,cpp,Release,)
cpp-asan: $(DEPS)
	@mkdir -p build
	$(call cpp_build,asan,RelWithDebInfo,address$(,)undefined)
cpp-tsan: $(DEPS)
	@mkdir -p build
	$(call cpp_build,tsan,RelWithDebInfo,thread,$(TSAN_WINGS))

, := ,

# The libFuzzer targets of fuzz/ (clang, ASan + UBSan, coverage), in build/fuzz.
fuzz-build: $(DEPS)
	@mkdir -p build
	$(CMAKE) -S . -B build/fuzz -G Ninja -DCMAKE_MAKE_PROGRAM=$(CURDIR)/$(VENV)/bin/ninja $(LAUNCH) \
	  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=OFF \
	  -DSTOKER_FUZZ=ON -DSTOKER_SANITIZE=address$(,)undefined > build/fuzz.configure.log
	$(CMAKE) --build build/fuzz -j $(JOBS)

# Each fuzz target for FUZZ_SECONDS (one after the other; FUZZ_JOBS side by side), results in
# build/fuzz/results.json, findings (crash-*, leak-*, timeout-*, oom-*) in build/fuzz/findings/.
# The seeds come from the sample data, hence `install`.
FUZZ_SECONDS ?= 600
FUZZ_JOBS    ?= 1
fuzz: install fuzz-build
	$(PY) fuzz/run.py --seconds $(FUZZ_SECONDS) --jobs $(FUZZ_JOBS) --json build/fuzz/results.json

# The Python extension built with ASan + UBSan into build/pyasan/site (not .venv): the Python
# tests run against it with libasan preloaded (tools/run_tests.py). Its build directory is as deep
# as build/asan's: ccache's base_dir makes paths relative to the build directory, so only then is
# the second compile of the engine and the wings a cache hit (at build/pyasan/build every file was
# compiled again: about 6 minutes of `make test` on 2 cores).
ext-asan: $(DEPS)
	@mkdir -p build/pyasan
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m pip install -q --no-build-isolation --no-deps \
	  --upgrade --target build/pyasan/site -C build-dir=build/pyasan-build \
	  -C cmake.build-type=RelWithDebInfo -C cmake.define.STOKER_SANITIZE=address$(,)undefined \
	  -C cmake.define.STOKER_TESTING=ON -C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=$(LAUNCHER) . \
	  > build/pyasan/install.log 2>&1 || (cat build/pyasan/install.log; exit 1)

# Everything: the release, ASan/UBSan and TSan C++ lanes (the fuzz seeds and regression inputs
# replay in the first two), the Python tests (slow ones included) against .venv and against the ASan/UBSan extension, and the wheel installed in a
# clean room (tests/python/test_wheel.py). CI runs this (.ci/run).
test: install cpp cpp-asan cpp-tsan ext-asan wheel
	$(PY) tools/run_tests.py

# The edit-test loop, a few minutes: the release C++ tests and the Python tests not marked slow
# (tests/python/conftest.py). Same closing line as `make test`.
check: install cpp
	$(PY) tools/run_tests.py --quick

# 100 epochs of the image pipeline and of a Python dataset with persistent process workers:
# RSS, descriptors, threads, children per epoch; plot in build/soak/rss.png.
soak: install
	$(PY) bench/soak.py --out build/soak

bench: install
	$(PY) bench/bench_arrays.py
	$(PY) bench/bench_tune.py
	$(PY) bench/bench_autotune.py

# The peers of bench/bench_images.py, each in its own environment under .venv-peers/ (never .venv).
bench-peers: install
	bash bench/setup_peers.sh

bench-images: bench-peers
	$(PY) bench/bench_images.py

# Remote shards on a local S3 (moto) behind a capped link: Stoker vs WebDataset, Mosaic Streaming,
# LitData (their environment: bench/setup_peers.sh remote).
bench-remote: install
	bash bench/setup_peers.sh remote
	$(PY) bench/bench_remote.py

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf build
