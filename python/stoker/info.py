"""What this Stoker is and what it found, for a bug report: ``python -m stoker.info`` (or
``stoker info``; ``--json`` for a machine).

- the version, the Python, the system (and its glibc);
- the build: the wheel's platform tag (manylinux_2_28: glibc 2.28 and later), the compiler and
  C++ library, the glibc headers it was compiled against, the SIMD it uses, the image codecs,
  and where the loaded libjpeg and libpng come from (a wheel's own stoker.libs/, or the system);
- the optional parts and where each was found: CUDA (the driver), nvJPEG and NVRTC (for
  ``decode="cuda"``), FFmpeg, pyarrow (``stoker[tables]``), obstore (``stoker[remote]``), Ray
  (``stoker[ray]``), and torch.

Finding things has no side effect beyond loading the libraries that Stoker would load to use
them. ``summary()`` is the one line a benchmark prints to say which build it measured.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys

from . import _native
from ._version import __version__

__all__ = ["facts", "summary", "main"]


def _mapped(*names):
    """{name: path} of the shared libraries this process has mapped whose file name starts with
    one of `names` (the copy actually in use, wherever it came from)."""
    found = {}
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1]
                base = os.path.basename(path)
                for name in names:
                    if base.startswith(name) and ".so" in base:
                        found.setdefault(name, path)
    except OSError:
        pass
    return found


def _wheel_tags():
    """The installed distribution's tags (its dist-info's WHEEL file), e.g.
    ['cp311-cp311-manylinux_2_28_x86_64']."""
    try:
        text = importlib.metadata.distribution("stoker").read_text("WHEEL") or ""
    except importlib.metadata.PackageNotFoundError:
        return []
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Tag:")]


def _package(name, dist=None):
    """(version, where) of an installed package, without importing it; (None, None) if absent."""
    spec = importlib.util.find_spec(name)
    if spec is None:
        return None, None
    try:
        version = importlib.metadata.version(dist or name)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown version"
    where = spec.submodule_search_locations[0] if spec.submodule_search_locations else spec.origin
    return version, where


def _cuda():
    if not _native.gpu.cuda_available():
        return {"found": False, "why": "no NVIDIA driver (libcuda.so.1) or no visible GPU"}
    return {"found": True, "devices": _native.gpu.cuda_device_count(),
            "from": _mapped("libcuda.so").get("libcuda.so")}


def _gpu_decode(cuda):
    from .gpu.decode import library_dirs
    try:
        nvjpeg, nvrtc = _native.gpu.gpu_decode_libraries(library_dirs())
    except RuntimeError as e:
        return {"found": False, "why": str(e)}
    out = {"found": True, "nvjpeg": nvjpeg, "nvrtc": nvrtc}
    if not cuda["found"]:
        out["note"] = "found, but unusable without CUDA"
    return out


def _arrow():
    version, where = _package("pyarrow")
    out = {"found": version is not None, "version": version, "from": where,
           "stoker._arrow": importlib.util.find_spec("stoker._arrow") is not None}
    if not out["stoker._arrow"]:
        out["note"] = ("this build has no stoker._arrow (built without pyarrow: TableDataset "
                       "is unavailable)")
    elif version is not None:
        try:
            from .sources import tables  # noqa: F401  (imports pyarrow, then stoker._arrow)
            from . import _arrow  # noqa: F401
            lib = _mapped("libarrow.so")
            out["libarrow"] = lib.get("libarrow.so")
        except ImportError as e:
            out["error"] = f"stoker._arrow does not load: {e}"
    return out


def _ffmpeg():
    """The video module and the FFmpeg it links (the system's, found at build time)."""
    if importlib.util.find_spec("stoker._video") is None:
        return {"found": False,
                "why": "this build has no stoker._video (built without FFmpeg's development "
                       "libraries: VideoDataset is unavailable; docs/install.md)"}
    try:
        from . import _video
    except ImportError as e:
        return {"found": False, "why": f"stoker._video does not load: {e}"}
    return {"found": True, "version": _video.ffmpeg_versions(),
            "from": _mapped("libavcodec").get("libavcodec")}


def _audio():
    """The audio module, the FFmpeg it links and its resampler."""
    if importlib.util.find_spec("stoker._audio") is None:
        return {"found": False,
                "why": "this build has no stoker._audio (built without FFmpeg's development "
                       "libraries with libswresample: AudioDataset is unavailable; "
                       "docs/audio.md)"}
    try:
        from . import _audio
    except ImportError as e:
        return {"found": False, "why": f"stoker._audio does not load: {e}"}
    return {"found": True, "version": f"resampler {_audio.resampler()}; "
                                      f"{_audio.ffmpeg_versions()}",
            "from": _mapped("libswresample").get("libswresample")}


def facts():
    """Everything ``python -m stoker.info`` prints, as a dict."""
    build = dict(_native.build_info())
    tags = _wheel_tags()
    build["wheel_tags"] = tags
    libs = _mapped("libjpeg", "libpng")
    build["libjpeg_from"] = libs.get("libjpeg")
    build["libpng_from"] = libs.get("libpng")
    cuda = _cuda()
    optional = {"cuda": cuda, "gpu_decode": _gpu_decode(cuda),
                "ffmpeg": _ffmpeg(), "audio": _audio(),
                "pyarrow": _arrow()}
    for name, dist in (("obstore", None), ("ray", None), ("torch", None), ("numpy", None)):
        version, where = _package(name, dist)
        optional[name] = {"found": version is not None, "version": version, "from": where}
    return {
        "stoker": __version__, "location": os.path.dirname(os.path.abspath(__file__)),
        "python": f"{platform.python_implementation()} {platform.python_version()} "
                  f"({sys.executable})",
        "system": f"{platform.system()} {platform.release()} {platform.machine()}, "
                  f"glibc {build.get('glibc_running', '?')}",
        "build": build, "optional": optional,
    }


def _tag_words(tags):
    if not tags:
        return "not installed from a wheel (a source tree on sys.path?)"
    words = ", ".join(tags)
    plat = tags[0].split("-")[-1]
    if plat.startswith("manylinux_"):
        major, minor = plat.split("_")[1:3]
        return f"{words} (runs on glibc {major}.{minor} and later)"
    if plat.startswith("linux_"):
        return f"{words} (built on this machine from source, for this machine)"
    return words


def _compiler(b):
    """The compiler, short: zig's clang names its bootstrap repository and commit."""
    name = b["compiler"]
    if "ziglang" in name:
        name = name.split(" (")[0] + " (zig)"
    return name


def summary():
    """One line: the build a benchmark measured."""
    b = _native.build_info()
    tags = _wheel_tags()
    return (f"stoker {__version__} [{tags[0] if tags else 'source tree'}; {_compiler(b)}; "
            f"{b['cxx_library']}; glibc headers {b['glibc_headers']}; libjpeg-turbo "
            f"{b['libjpeg_turbo']}]")


# How each optional part is named in the report, and what installs it.
_LABELS = {"cuda": ("CUDA", ""), "gpu_decode": ("nvJPEG/NVRTC", ""), "ffmpeg": ("FFmpeg", ""),
           "audio": ("audio", "stoker[audio]"),
           "pyarrow": ("pyarrow", "stoker[tables]"), "obstore": ("obstore", "stoker[remote]"),
           "ray": ("Ray", "stoker[ray]"), "torch": ("torch", ""), "numpy": ("numpy", "")}


def _optional_line(name, f):
    label, extra = _LABELS[name]
    if not f.get("found"):
        why = f.get("why") or "not installed" + (f" ({extra})" if extra else "")
        if name == "gpu_decode":  # the whole search is in --json
            why = why.split(" Tried:")[0] + " (--json: where it looked)"
        line = f"  {label:<13} no: {why}"
        if name == "pyarrow" and f.get("note"):
            line += f"; {f['note']}"
        return line
    if name == "cuda":
        return f"  {label:<13} yes: {f['devices']} device(s); driver {f.get('from')}"
    if name == "gpu_decode":
        line = f"  {'nvJPEG':<13} {f['nvjpeg']}\n  {'NVRTC':<13} {f['nvrtc']}"
        return line + (f"  ({f['note']})" if f.get("note") else "")
    line = f"  {label:<13} {f['version']} from {f['from']}"
    if name == "pyarrow":
        if f.get("libarrow"):
            line += f"; stoker._arrow links {f['libarrow']}"
        for key in ("note", "error"):
            if f.get(key):
                line += f"; {f[key]}"
    return line


def format_facts(f):
    b = f["build"]
    cpu = []
    if "cpu_avx2" in b:
        cpu = [f"this CPU: AVX2 {'yes' if b['cpu_avx2'] else 'no'}, "
               f"FMA {'yes' if b['cpu_fma'] else 'no'}"]
    lines = [
        f"stoker {f['stoker']} ({f['location']})",
        f"python   {f['python']}",
        f"system   {f['system']}",
        "build",
        f"  wheel        {_tag_words(b['wheel_tags'])}",
        f"  compiler     {_compiler(b)}; {b['cxx_library']}",
        f"  glibc        compiled against the headers of glibc {b['glibc_headers']}",
        f"  SIMD         {b['simd_baseline']}, AVX2/FMA kernels chosen at run time"
        + (f" ({cpu[0]})" if cpu else ""),
        f"  libjpeg      libjpeg-turbo {b['libjpeg_turbo']}"
        f"{' with SIMD' if b['libjpeg_simd'] else ' without SIMD'}, from {b['libjpeg_from']}",
        f"  libpng       {b['libpng_loaded']} (built against {b['libpng_headers']}), "
        f"from {b['libpng_from']}",
        "optional parts",
    ]
    for name in ("cuda", "gpu_decode", "ffmpeg", "audio", "pyarrow", "obstore", "ray", "torch",
                 "numpy"):
        lines.append(_optional_line(name, f["optional"][name]))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(prog="stoker info", description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help="print the facts as JSON")
    args = p.parse_args(argv)
    f = facts()
    print(json.dumps(f, indent=2) if args.json else format_facts(f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
