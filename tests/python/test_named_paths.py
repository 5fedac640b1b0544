"""Every file that a comment or a doc names exists (issue 35, point 6).

A comment that says "see bindings/gpu.cc" after bindings/gpu.cc has gone sends the reader nowhere.
This test reads the places where the tree talks about itself and holds each path they name to a
file of the tree. It reads files only (no ``import stoker``), so it runs without the extension.

What is read (the files come from ``git ls-files``, untracked ones not ignored included):
- C++ (``.cc``, ``.h``) under src/ include/ bindings/ fuzz/ examples/: the ``//`` and ``/* */``
  comments;
- Python under python/ bench/ tools/ tests/ fuzz/ scripts/: the ``#`` comments and the string
  constants that stand as statements (docstrings);
- Markdown: README.md and docs/ (the whole text, code blocks included);
- the Makefile, the CMake files and the shell scripts: their ``#`` comments.

What is a path: a run of ``[A-Za-z0-9_./-]`` ending in one of the extensions in ``EXTENSIONS``,
not part of a URL, a longer word or a pattern. One that holds a ``/`` must name a file relative to
the repository root, to the folder of the file that names it, or to one of ``CODE_ROOTS``, the
folders code names files against (include/ for a header as it is included, python/ and
python/stoker/ for the package's modules, src/ for the engine's folders). A bare ``name.ext`` must
be the name of some file of the tree. Skipped: a token with a glob or a placeholder next to it
(``*``, ``{``, ``<``, ``$``: a pattern), one that starts with a dot (a suffix such as
``.idx.json``), one that git ignores (``build/...``: what builds and runs write).

Not held (``NOT_REPO_PATHS``, each group with why): names that are not files of this repository:
what code writes at run time, the user's own files and placeholders in examples, files of other
projects and system headers.

Run as a script (``python tests/python/test_named_paths.py``) it prints each stale reference.
"""

import ast
import io
import os
import re
import subprocess
import tokenize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

EXTENSIONS = ("h", "cc", "py", "md", "sh", "txt", "json", "toml", "cmake")

# The folders code names files against: a header as it is included ("stoker/engine.h": include/),
# the package's modules ("stoker/native.py": python/; "gpu/feed.py": python/stoker/), and the
# engine's folders by their own names ("engine/engine.cc": src/).
CODE_ROOTS = ("include", "python", "python/stoker", "src")

# Names that look like paths but are not files of this repository. A token is matched whole.
NOT_REPO_PATHS = {
    "arrow.json",  # Arrow's canonical JSON extension type's name, not a file
    # Written at run time: the names usage examples give to --json, and what tools write.
    "out.json", "tune.json", "gpu.json", "gpu_decode.json", "images.json",
    "_stoker_index.json",   # the index a table or tar dataset writes beside its files
    "summary.json",         # tools/gpu_check.sh's summary on the GPU machine
    "OUT/soak.json",        # bench/soak.py, under its --out folder
    "root/manifest.json",   # stoker sample-data, under its root
    "kernel_source.cc",     # generated in the build tree by src/gpu/embed.cmake
    # What transformers' Trainer and stoker.integrations.transformers write in a checkpoint.
    "stoker_loader.json", "trainer_state.json",
    # Results that bench/results/README.md says are not recorded yet (no GPU run so far).
    "bench/results/bench_gpu.md", "bench/results/bench_gpu_decode.md",
    "bench_gpu.md", "bench_gpu_decode.md", "seed_cost.md",
    # A Hugging Face tokenizer's files (the user's: stoker.Tokenizer.from_file reads them).
    "tokenizer.json", "tokenizer_config.json",
    # A Hugging Face model's image processor config (the user's: ImageProcessor.from_pretrained).
    "preprocessor_config.json",
    # transformers 5's processor config (the image processor nested in it) and a LLaVA SFT file:
    # the user's (stoker.VLMDataset reads them); the VLM benchmark's rows, written under
    # bench/data at run time.
    "processor_config.json", "llava_v1_5_mix665k.json", "llava.json", "vlm/llava.json",
    "llama-3/tokenizer.json",  # docs/text.md's example of one
    # Files of a LeRobot dataset (the user's: stoker.LeRobotDataset reads them).
    "meta/info.json", "info.json", "meta/tasks.parquet",
    # Placeholders and the user's own files in examples.
    "x.cc", "x_test.cc", "train.py",
    "train_manifest.json",  # a NeMo manifest (README.md, docs/audio.md)
    # Files of other projects: PyTorch, torchvision, Megatron-LM, Arrow, FFCV, Mosaic Streaming.
    "test/test_dataloader.py", "ATen/core/MT19937RNGEngine.h",
    "torchtitan/components/dataloader.py",
    "torchvision/transforms/v2/_auto_augment.py", "v2/functional/_color.py", "_misc.py",
    "references/classification/presets.py",
    "megatron/core/datasets/indexed_dataset.py",
    "arrow/c/abi.h",
    # Jinja's sources (pallets/jinja), which src/text/jinja/ follows, and transformers' module of
    # chat-template helpers.
    "lexer.py", "parser.py", "filters.py", "tests.py", "sandbox.py", "jinja2/filters.py",
    "jinja2/tests.py", "jinja2/lexer.py", "jinja2/parser.py", "chat_template_utils.py",
    # Kaldi's sources (kaldi-asr/kaldi, src/feat/), whose fbank tests/python/test_audio_features.py
    # follows.
    "feat/feature-window.cc", "feature-fbank.cc", "mel-computations.cc",
    "setup.py",
    "index.json",
    # Headers of the system, the compiler and the image and CUDA libraries.
    "jpeglib.h", "jconfig.h", "jmorecfg.h", "jerror.h", "jpegint.h", "png.h", "pngconf.h",
    "pnglibconf.h", "zlib.h", "zconf.h", "stddef.h", "FuzzedDataProvider.h", "nvjpeg.h",
    "sentencepiece_processor.h",
}

_PATH = re.compile(
    r"(?<![\w./:@~*{}<>$-])"     # not inside a longer word, a URL, an attribute chain, a pattern
    r"((?:[\w.-]+/)*[\w.-]*\w\.(?:" + "|".join(EXTENSIONS) + r"))"
    r"(?![\w/*{<$-])")           # nor followed by more of a name or a pattern
_PATTERN = re.compile(r"[*{}<>$]")


def tree_files():
    """The tree's files as they are on disk: tracked, or new and not ignored (a file being added
    counts before ``git add``; one deleted does not, before ``git rm``)."""
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [p for p in out.splitlines() if p and os.path.isfile(os.path.join(ROOT, p))]


_CPP_TOKEN = re.compile(r"""
    //(?P<line>[^\n]*)                          # a // comment
  | /\*(?P<block>[\s\S]*?)(?:\*/|\Z)             # a /* */ comment
  | \bR"(?P<delim>[^(\s]*)\([\s\S]*?\)(?P=delim)"  # a raw string: skipped
  | "(?P<string>(?:\\.|[^"\\\n])*)"                # a string literal
  | '(?:\\.|[^'\\\n])*'                            # a character literal: skipped
""", re.VERBOSE)


def _cpp_comments(text, strings=False):
    """(line, text) of each // and /* */ comment of C++ source; with ``strings``, of each string
    literal too, but those of ``#include`` lines."""
    out = []
    for m in _CPP_TOKEN.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        if m.group("line") is not None:
            out.append((line, m.group("line")))
        elif m.group("block") is not None:
            out.append((line, m.group("block")))
        elif strings and m.group("string") is not None:
            start_of_line = text.rfind("\n", 0, m.start()) + 1
            if not text[start_of_line:m.start()].lstrip().startswith("#"):
                out.append((line, m.group("string")))
    return out


def _python_comments(text):
    """(line, text) of each # comment and each string that stands as a statement (docstrings)."""
    out = []
    statement_start = True
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string[1:]))
        elif tok.type == tokenize.STRING and statement_start:
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):  # an f-string: its text as written
                value = tok.string
            if isinstance(value, str):
                out.append((tok.start[0], value))
        if tok.type not in (tokenize.COMMENT, tokenize.NL):
            statement_start = tok.type in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    return out


def _hash_comments(text):
    """(line, text) of each # comment of a Makefile, CMake file or shell script."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if stripped.startswith("#") and not stripped.startswith("#!"):
            out.append((number, stripped[1:]))
        else:
            m = re.search(r"\s#\s", line)  # a comment after code
            if m and line.count('"', 0, m.start()) % 2 == 0:
                out.append((number, line[m.end():]))
    return out


def commentary(path, text):
    """The parts of a file that talk about the tree, as (line, text), or [] if it is not read."""
    top = path.split("/", 1)[0]
    name = os.path.basename(path)
    if path.endswith((".cc", ".h")) and top in ("src", "include", "bindings", "fuzz", "examples"):
        return _cpp_comments(text, strings=top == "bindings")
    if path.endswith(".py") and top in ("python", "bench", "tools", "tests", "fuzz", "scripts"):
        return _python_comments(text)
    if path.endswith(".md"):
        return [(number, line) for number, line in enumerate(text.splitlines(), 1)]
    if name in ("Makefile", "CMakeLists.txt", "run") or path.endswith((".cmake", ".sh")):
        return _hash_comments(text)
    return []


def named_paths(text):
    for m in _PATH.finditer(text):
        token = m.group(1)
        if token.startswith("./"):
            token = token[2:]
        if (token.startswith(".") or _PATTERN.search(text[m.end():m.end() + 1])
                or token in NOT_REPO_PATHS):
            continue  # a suffix (``.idx.json``), a pattern, or not a file of this repository
        yield token


def resolves(token, where, files, names):
    if "/" not in token:
        return token in names
    token = token.rstrip("/")
    here = os.path.dirname(where)
    for base in ("", here, *CODE_ROOTS):
        candidate = os.path.normpath(os.path.join(base, token))
        if candidate in files:
            return True
    return False


def ignored_by_git(paths):
    """The paths git ignores: what builds and runs write (build/, .venv/), not the tree's."""
    if not paths:
        return set()
    out = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=ROOT,
                         input="\n".join(paths), capture_output=True, text=True).stdout
    return set(out.splitlines())


def stale_references(named=None):
    """``path:line: token`` for each named path that is not a file of the tree; ``named``, a list,
    gets every (path, token) read."""
    files = set(tree_files())
    names = {os.path.basename(p) for p in files}
    stale = []
    for path in sorted(files):
        full = os.path.join(ROOT, path)
        if not os.path.isfile(full):
            continue
        try:
            with open(full, encoding="utf-8") as f:
                text = f.read()
        except UnicodeDecodeError:
            continue
        for line, part in commentary(path, text):
            for offset, chunk in enumerate(part.split("\n")):
                for token in named_paths(chunk):
                    if named is not None:
                        named.append((path, token))
                    if not resolves(token, path, files, names):
                        stale.append((f"{path}:{line + offset}", token))
    generated = ignored_by_git(sorted({token for _, token in stale if "/" in token}))
    return [f"{where}: {token}" for where, token in stale if token not in generated]


def test_every_path_a_comment_or_doc_names_exists():
    if not os.path.exists(os.path.join(ROOT, ".git")):
        import pytest
        pytest.skip("not a git checkout: the tree's files come from git ls-files")
    stale = stale_references()
    assert not stale, ("comments or docs name files that are not in the tree (fix the reference, "
                       "or, if it is not a path of this repository, add it to NOT_REPO_PATHS with "
                       "why):\n" + "\n".join(stale))


def test_the_scanner_sees_paths_and_skips_what_is_not_one():
    found = lambda text: list(named_paths(text))  # noqa: E731
    assert found("see bindings/gpu.cc and loader.h.") == ["bindings/gpu.cc", "loader.h"]
    assert found("https://example.com/a/b.py s3://bucket/x.json") == []
    assert found("shards/*.json, s-{0..3}.txt, <name>.py, $DIR/a.sh") == []
    assert found("its sidecar ``<shard>.idx.json``, tests/python/test_vision_*_ops.py") == []
    assert found("writes _stoker_index.json") == []
    cpp = '#include "gone.h"\n// see a.h\nf("in b.cc"); /* c.h */\n'
    assert _cpp_comments(cpp) == [(2, " see a.h"), (3, " c.h ")]
    assert _cpp_comments(cpp, strings=True) == [(2, " see a.h"), (3, "in b.cc"), (3, " c.h ")]
    files = {"src/engine/engine.cc", "include/stoker/engine.h", "python/stoker/native.py"}
    names = {os.path.basename(p) for p in files}
    assert resolves("engine.cc", "README.md", files, names)
    assert resolves("stoker/engine.h", "src/engine/engine.cc", files, names)
    assert resolves("engine/engine.cc", "docs/x.md", files, names)
    assert resolves("stoker/native.py", "tests/python/t.py", files, names)
    assert not resolves("bindings/gpu.cc", "src/gpu/x.cc", files, names)
    assert not resolves("skip_policy.h", "src/engine/x.cc", files, names)


if __name__ == "__main__":
    read = []
    rows = stale_references(read)
    for row in rows:
        print(row)
    print(f"{len(read)} paths named in {len({p for p, _ in read})} files; {len(rows)} stale")
