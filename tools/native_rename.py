#!/usr/bin/env python3
"""Rewrites references to stoker._native's flat names into its per-wing submodules.

    native_rename.py [--names native_names.tsv] [--check] PATH...

PATH: files or directories (every *.py, *.pyi, *.md, *.rst, *.txt, *.cc, *.h, *.sh, *.toml under
them). The mapping (old flat name TAB new dotted path, e.g. "Loader<TAB>engine.Loader") is
native_names.tsv beside this script unless --names says otherwise. Rewritten:

  _native.Name / stoker._native.Name        -> _native.engine.Name / stoker._native.engine.Name
  ALIAS.Name, where the file has `import stoker._native as ALIAS` or
             `from stoker import _native as ALIAS` / `from . import _native as ALIAS`
  from ._native import a, b as c            -> one `from ._native.<wing> import ...` per wing
  from stoker._native import (a, b)         -> likewise (the parenthesized, multi-line form too)

Idempotent: names already under a submodule are left alone, so it can be re-run on another
checkout, or on the same one after a merge. `self._native.x` (an attribute, not the module) is
never touched. --check lists what would change and exits 1 if anything would.
"""
import argparse
import os
import re
import sys

SUFFIXES = (".py", ".pyi", ".md", ".rst", ".txt", ".cc", ".h", ".sh", ".toml", ".cfg")


def load(path):
    mapping = {}
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            old, new = line.split("\t")
            mapping[old] = new
    return mapping


def rewrite(text, mapping):
    names = "|".join(sorted(map(re.escape, mapping), key=len, reverse=True))

    # 1. attribute access on the module: _native.X, stoker._native.X
    attr = re.compile(r"(?<![\w.])((?:stoker\.)?_native)\.(" + names + r")\b")
    text = attr.sub(lambda m: f"{m.group(1)}.{mapping[m.group(2)]}", text)

    # 2. aliases of the module
    aliases = set(re.findall(r"^\s*import\s+stoker\._native\s+as\s+(\w+)", text, re.M))
    aliases |= set(re.findall(r"^\s*from\s+(?:stoker|\.)\s+import\s+_native\s+as\s+(\w+)", text, re.M))
    for alias in aliases:
        pat = re.compile(r"(?<![\w.])(" + re.escape(alias) + r")\.(" + names + r")\b")
        text = pat.sub(lambda m: f"{m.group(1)}.{mapping[m.group(2)]}", text)

    # 3. from ... _native import names
    imp = re.compile(
        r"^(?P<indent>[ \t]*)from[ \t]+(?P<mod>(?:stoker)?\._native|\.\._native)[ \t]+import[ \t]+"
        r"(?:\((?P<paren>[^)]*)\)|(?P<flat>[^\n#]*?(?:\\\n[^\n#]*?)*))[ \t]*(?P<comment>#[^\n]*)?$",
        re.M)

    def imports(m):
        items = m.group("paren") if m.group("paren") is not None else m.group("flat").replace("\\\n", " ")
        items = [i.strip() for i in re.sub(r"#[^\n]*", "", items).split(",") if i.strip()]
        by_module, order = {}, []
        for item in items:
            name = item.split()[0]
            target = m.group("mod")
            if name in mapping:
                wing = mapping[name].rsplit(".", 1)[0]
                target = f"{m.group('mod')}.{wing}"
            if target not in by_module:
                by_module[target] = []
                order.append(target)
            by_module[target].append(item)
        if order == [m.group("mod")]:
            return m.group(0)  # nothing of ours (or already rewritten)
        lines = []
        for target in order:
            line = f"{m.group('indent')}from {target} import {', '.join(by_module[target])}"
            if len(line) > 99:
                inner = ",\n".join(f"{m.group('indent')}    {i}" for i in by_module[target])
                line = f"{m.group('indent')}from {target} import (\n{inner},\n{m.group('indent')})"
            lines.append(line)
        if m.group("comment"):
            lines[0] += "  " + m.group("comment")
        return "\n".join(lines)

    return imp.sub(imports, text)


def files(paths):
    for p in paths:
        if os.path.isdir(p):
            for root, dirs, names in os.walk(p):
                dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
                for n in sorted(names):
                    if n.endswith(SUFFIXES):
                        yield os.path.join(root, n)
        elif os.path.isfile(p):
            yield p


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--names", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "native_names.tsv"))
    ap.add_argument("--check", action="store_true")
    ap.add_argument("paths", nargs="+")
    args = ap.parse_args()
    mapping = load(args.names)
    changed = []
    for path in files(args.paths):
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            continue
        new = rewrite(text, mapping)
        if new != text:
            changed.append(path)
            if not args.check:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
    for path in changed:
        print(path)
    return 1 if args.check and changed else 0


if __name__ == "__main__":
    sys.exit(main())
