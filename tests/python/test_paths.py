"""stoker/sources/paths.py: the one rule by which datasets of many files name them."""

import os

import pytest

from stoker.sources.paths import expand, expand_braces


def test_braces_expand_ranges_with_their_padding_and_alternatives_in_order():
    assert expand_braces("s-{000..003}.bin") == [f"s-{i:03d}.bin" for i in range(4)]
    assert expand_braces("{08..10}") == ["08", "09", "10"]
    assert expand_braces("{3..1}") == ["3", "2", "1"]
    assert expand_braces("{b,a}-{1..2}") == ["b-1", "b-2", "a-1", "a-2"]
    assert expand_braces("{x,{y,z}}") == ["x", "y", "z"]
    assert expand_braces("lit{}eral{") == ["lit{}eral{"]  # no comma, no range: a literal


def test_expand_lists_directories_patterns_and_paths_in_order(tmp_path):
    for name in ("b.bin", "a.bin", "c.txt", "d.bin"):
        (tmp_path / name).write_bytes(b"")
    d = str(tmp_path)
    assert expand(d, "token shard", (".bin",)) == [os.path.join(d, n)
                                                  for n in ("a.bin", "b.bin", "d.bin")]
    assert expand([f"{d}/d.bin", f"{d}/[ab].bin"], "shard") == [
        f"{d}/d.bin", f"{d}/a.bin", f"{d}/b.bin"]
    assert expand(f"{d}/{{d,a}}.bin", "shard") == [f"{d}/d.bin", f"{d}/a.bin"]


def test_expand_names_what_matches_nothing(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no such token shard: .*x-2\.bin"):
        (tmp_path / "x-1.bin").write_bytes(b"")
        expand(str(tmp_path / "x-{1..2}.bin"), "token shard")
    with pytest.raises(FileNotFoundError, match=r"no tar shard matches .*\*\.tar"):
        expand(str(tmp_path / "*.tar"), "tar shard")
    with pytest.raises(FileNotFoundError, match=r"no table file \(.parquet\) in"):
        expand(str(tmp_path), "table file", (".parquet",))
    with pytest.raises(ValueError, match="no token shard given"):
        expand([], "token shard")
