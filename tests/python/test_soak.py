"""The soak's short version (bench/soak.py --quick): 8 epochs of the image pipeline and of a
Python dataset with persistent process workers. RSS flat after epoch 3 (<= 2%), descriptors,
threads, child processes and memfds constant from epoch to epoch, and nothing left (no child, no
memfd, no /dev/shm entry, descriptors and threads as before) once the loader is gone. The full
soak (100 epochs) is `make soak`."""

import json
import os
import subprocess
import sys

from conftest import ASAN_LANE

SOAK = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "soak.py")


def test_soak_quick(tmp_path):
    # Under ASan the RSS is mostly its quarantine of freed memory: every other check still holds.
    flags = ["--no-rss-check"] if ASAN_LANE else []
    proc = subprocess.run([sys.executable, SOAK, "--quick", "--out", str(tmp_path)] + flags,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    results = json.loads((tmp_path / "soak.json").read_text())
    assert set(results) == {"images", "python"}
    for name, r in results.items():
        assert [row["epoch"] for row in r["epochs"]] == list(range(1, 9)), name
        failed = [c for c in r["checks"] if not c["ok"]]
        assert not failed, (name, failed)
        assert len(r["checks"]) == (10 if ASAN_LANE else 11)
    python = results["python"]["epochs"]
    assert all(row["children"] == 2 for row in python)  # the persistent workers, every epoch
    assert (tmp_path / "rss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
