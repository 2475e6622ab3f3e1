"""Text that is on every machine of this project, read in place (nothing copied into the repo):

- gettext catalogs with German translations (/usr/share/locale/de/LC_MESSAGES/*.mo): English
  messages with human German references;
- man pages (/usr/share/man/man1, man8), reduced from troff to plain text;
- the Python standard library's own source: functions to rewrite.

Every reader returns items in a fixed order (sorted file names), so a seeded choice is reproducible.
"""

from __future__ import annotations

import ast
import functools
import gettext
import gzip
import random
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

GETTEXT_DIR = Path("/usr/share/locale/de/LC_MESSAGES")
MAN_DIRS = [Path("/usr/share/man/man1"), Path("/usr/share/man/man8")]


@dataclass(frozen=True)
class Message:
    domain: str
    english: str
    german: str


def gettext_messages(directory: Path = GETTEXT_DIR, min_chars: int = 30, max_chars: int = 400) -> list[Message]:
    """English -> German message pairs from the machine's compiled catalogs (no plurals, no headers)."""
    out = []
    for path in sorted(directory.glob("*.mo")):
        try:
            with path.open("rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog
        except (OSError, UnicodeDecodeError):
            continue
        for english, german in sorted((k, v) for k, v in catalog.items() if isinstance(k, str)):
            if english and german and english != german and min_chars <= len(english) <= max_chars and "\x04" not in english:
                out.append(Message(path.stem, english, german))
    return out


_TROFF_ESCAPES = [(r"\\f[BIRP1-9]|\\f\(\w\w|\\f\[\w*\]", ""), (r"\\-", "-"), (r"\\\(aq", "'"), (r"\\\(lq|\\\(rq", '"'),
                  (r"\\\(em|\\\(en", "-"), (r"\\&|\\:|\\%|\\c", ""), (r"\\e", r"\\"), (r"\\\(bu", "*"),
                  (r"\\ ", " "), (r"\\s[-+]?\d", ""), (r'\\"', "")]


def troff_to_text(source: str) -> str:
    """A rough troff/man -> plain text reduction: enough for prompts, not for typesetting."""
    lines = []
    for line in source.splitlines():
        if line.startswith((".\\\"", "'\\\"", '.\\"')):
            continue
        if line.startswith((".", "'")):
            macro, _, rest = line[1:].partition(" ")
            if macro in ("SH", "SS"):
                lines += ["", rest.strip('"').upper() if macro == "SH" else rest.strip('"')]
            elif macro in ("B", "I", "BR", "IR", "RB", "BI", "IB", "RI", "IP", "TP", "Nm", "Fl", "Ar"):
                text = rest.replace('"', "") if macro in ("BR", "IR", "RB", "BI", "IB", "RI") else rest.strip('"')
                if macro in ("BR", "IR", "RB", "BI", "IB", "RI"):
                    text = "".join(text.split()) if len(text.split()) <= 2 else text
                if text:
                    lines.append(text)
            elif macro in ("PP", "P", "LP", "sp", "br"):
                lines.append("")
            continue
        lines.append(line)
    text = "\n".join(lines)
    for pattern, repl in _TROFF_ESCAPES:
        text = re.sub(pattern, lambda _m, r=repl: r, text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def man_page_files(directories: list[Path] = MAN_DIRS) -> list[Path]:
    """Every compressed man page in the given sections, sorted."""
    # gcloud ships thousands of near-identical generated pages; they would crowd out everything else.
    return sorted(p for d in directories for p in d.glob("*.gz") if not p.name.startswith("gcloud"))


def read_man_page(path: Path) -> str | None:
    """A man page as plain text, paragraphs reflowed; None for links and unreadable files."""
    try:
        raw = gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace")
    except (OSError, EOFError):
        return None
    if raw.lstrip().startswith(".so "):  # a link to another page
        return None
    paragraphs = troff_to_text(raw).split("\n\n")
    reflowed = []
    for paragraph in paragraphs:
        lines = paragraph.splitlines()
        if lines and lines[0].isupper():  # a section heading stays on its own line
            reflowed.append(lines[0] + ("\n" + " ".join(lines[1:]) if lines[1:] else ""))
        else:
            reflowed.append(" ".join(lines))
    return re.sub(r"[ \t]+", " ", "\n\n".join(reflowed)).replace(" ,", ",").replace(" .", ".").strip()


def man_pages(count: int, seed: int = 0, min_chars: int = 1500, directories: list[Path] = MAN_DIRS) -> list[tuple[str, str]]:
    """(page name, plain text) for `count` man pages chosen by a seeded shuffle of the sorted list."""
    files = man_page_files(directories)
    random.Random(seed).shuffle(files)
    out = []
    for path in files:
        text = read_man_page(path)
        if text and len(text) >= min_chars:
            out.append((path.name.removesuffix(".gz"), text))
            if len(out) == count:
                break
    return out


def stdlib_functions(min_lines: int = 6, max_lines: int = 30, limit_files: int | None = None) -> list[tuple[str, str]]:
    """(module.function, source) for top-level functions of the standard library's own modules
    (parsed once a process: ~0.8 s for every module)."""
    return list(_stdlib_functions(min_lines, max_lines, limit_files))


def _parsed(path: Path) -> tuple[list[str], ast.Module] | None:
    """A source file's lines and syntax tree, or None where it does not read or parse."""
    try:
        source = path.read_text(encoding="utf-8")
        return source.splitlines(), ast.parse(source)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None


def _public_functions(body: list, lines: list[str], min_lines: int, max_lines: int):
    """(name, source) of the public functions among `body`'s statements that are min..max lines long."""
    for node in body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
            if min_lines <= node.end_lineno - node.lineno + 1 <= max_lines:
                yield node.name, "\n".join(lines[node.lineno - 1 : node.end_lineno])


@functools.lru_cache(maxsize=4)
def _stdlib_functions(min_lines: int, max_lines: int, limit_files: int | None) -> tuple[tuple[str, str], ...]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    files = sorted(p for p in root.glob("*.py") if not p.name.startswith("_"))
    for path in files[:limit_files]:
        if (parsed := _parsed(path)) is not None:
            lines, tree = parsed
            out += [(f"{path.stem}.{name}", source) for name, source in _public_functions(tree.body, lines, min_lines,
                                                                                          max_lines)]
    return tuple(out)


def stdlib_methods(min_lines: int = 5, max_lines: int = 25) -> list[tuple[str, str]]:
    """(module.Class.method, dedented source) for the public methods of the top-level classes of the
    standard library's modules and packages (its tests, idlelib and lib2to3 left out), parsed once a
    process: what stdlib_functions does not reach."""
    return list(_stdlib_methods(min_lines, max_lines))


@functools.lru_cache(maxsize=2)
def _stdlib_methods(min_lines: int, max_lines: int) -> tuple[tuple[str, str], ...]:
    import textwrap

    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "turtledemo", "ensurepip"}
    out = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if any(p in skip or p.startswith("_") for p in parts) or (parsed := _parsed(path)) is None:
            continue
        lines, tree = parsed
        module = ".".join(parts)[: -len(".py")]
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                out += [(f"{module}.{node.name}.{name}", textwrap.dedent(source))
                        for name, source in _public_functions(node.body, lines, min_lines, max_lines)]
    return tuple(out)
