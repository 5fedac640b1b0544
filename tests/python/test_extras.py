"""stoker._extras.require: an optional dependency imported, or an ImportError naming the extra;
the version written once."""

import re
import sys

import pytest

import stoker
from stoker import _extras, _version


def test_require_returns_the_module():
    assert _extras.require("json", "json") is sys.modules["json"]


def test_require_names_the_extra_and_keeps_the_cause(monkeypatch):
    for name in ("pyarrow", "pyarrow.parquet"):  # `import pyarrow` now raises ImportError
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=re.escape("pip install 'stoker[tables]'")) as e:
        _extras.require("pyarrow.parquet", "tables", "stoker.TableDataset")
    assert str(e.value).startswith("stoker.TableDataset needs pyarrow, which is not installed")
    assert isinstance(e.value.__cause__, ImportError)


def test_version_is_written_once():
    assert stoker.__version__ == _version.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", stoker.__version__)


def test_a_table_without_pyarrow_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ImportError, match=re.escape("stoker.TableDataset needs pyarrow, which "
                                                    "is not installed: pip install "
                                                    "'stoker[tables]'")):
        stoker.TableDataset("data.parquet")
