"""`python -m stoker.info` / `stoker info` (issue 41): the report a user pastes into a bug report
says the version, how the extension was built and what was found, and where. The clean rooms
(tools/clean_room.py) run it from each wheel; this runs it against the build under test."""

import contextlib
import io
import json
import subprocess
import sys

import stoker
import stoker.info
from stoker.cli import main as cli


def test_facts_name_the_build_and_every_optional_part():
    f = stoker.info.facts()
    assert f["stoker"] == stoker.__version__
    b = f["build"]
    assert b["compiler"].startswith(("gcc ", "clang ")) and "libstdc++" in b["cxx_library"]
    major, minor = (int(x) for x in b["glibc_headers"].split("."))
    assert major == 2 and minor >= 17
    assert b["libjpeg_turbo"] and b["libpng_loaded"] == b["libpng_headers"]
    # The libraries in use, found in the process: a wheel's stoker.libs/, or the system's.
    assert "libjpeg" in b["libjpeg_from"] and "libpng" in b["libpng_from"]
    assert set(f["optional"]) == {"cuda", "gpu_decode", "ffmpeg", "audio", "pyarrow", "obstore",
                                  "ray", "torch", "numpy"}
    for name, part in f["optional"].items():
        assert part["found"] in (True, False), name
        assert part["found"] or part.get("why") is not None or part.get("version") is None, name
    assert f["optional"]["numpy"]["found"]


def test_the_text_report_and_its_json_come_from_the_cli_and_the_module():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli(["info", "--json"]) == 0
    assert json.loads(out.getvalue())["stoker"] == stoker.__version__
    text = subprocess.run([sys.executable, "-m", "stoker.info"], check=True, capture_output=True,
                          text=True).stdout
    for line in ("build", "  wheel", "  compiler", "  glibc", "  SIMD", "  libjpeg", "  libpng",
                 "optional parts", "  CUDA", "  nvJPEG", "  FFmpeg", "  audio", "  pyarrow"):
        assert f"\n{line}" in text, (line, text)


def test_the_summary_is_one_line_with_version_compiler_and_glibc():
    line = stoker.info.summary()
    assert "\n" not in line and line.startswith(f"stoker {stoker.__version__} [")
    assert "glibc headers" in line and "libjpeg-turbo" in line
