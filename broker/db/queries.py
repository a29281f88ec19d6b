"""Named queries in procrastinate's style: each app keeps its SQL in ``<app>/queries.sql`` and
reaches it by name through ``<app>/queries.py`` (``Q.name``; ``ALL`` is the dict).

A file is a sequence of blocks::

    -- claim_pull --
    -- index: job_claim
    -- hot
    -- settings: enable_bitmapscan=off
    -- One line or more saying what it does and why it is shaped so.
    WITH ... ;

The name line opens a block; the comment lines right after it hold the metadata: ``index:`` is
required (the index that serves the statement, ``pk`` for a primary key lookup, or ``none (why)``
when none does), ``hot`` marks a hot-path statement (the plan tests must have a case for each),
``settings:`` planner settings the statement runs under (``broker.db.run`` sets them for the
statement's transaction and resets them after it; the plan tests and ``manage.py broker_plans``
EXPLAIN it under them), and every other comment line is its documentation. The SQL runs to the next name line; ``--``
comments inside it stay part of it. A missing ``index:``, an empty body or a name used twice is
an error when the file is loaded, so a broken registry never gets as far as a request.

A block whose first comment line is ``-- fragment`` is not a statement but a piece of one: a
predicate several statements (or branches of one) share, written once. A statement names it as
``{{name}}`` where it goes; the loaded statement (``sql`` and ``text``) has it written out, so what
is sent, EXPLAINed and PREPAREd is whole. A fragment never used, or a name no fragment has, is an
error when the file is loaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_NAME = re.compile(r"^--\s*([A-Za-z_][A-Za-z0-9_]*)\s*--\s*$")
_INDEX = re.compile(r"^--\s*index:\s*(.*?)\s*$")
_HOT = re.compile(r"^--\s*hot\s*$")
_SETTINGS = re.compile(r"^--\s*settings:\s*(.*?)\s*$")
_SETTING = re.compile(r"^([a-z_]+)\s*=\s*([A-Za-z0-9_.]+)$")
_FRAGMENT = re.compile(r"^--\s*fragment\s*$")
_USE = re.compile(r"\{\{([A-Za-z_][A-Za-z0-9_]*)\}\}")


# One token of SQL text: a string literal (E'...' with backslash escapes, or '...' with '' inside),
# a quoted identifier, a dollar-quoted body, a comment, a run of whitespace, or anything else.
_SQL_TOKEN = re.compile(r"""[Ee]'(?:[^'\\]|\\.|'')*'|'(?:[^']|'')*'|"(?:[^"]|"")*"|(\$\w*\$).*?\1|--[^\n]*|/\*.*?\*/|\s+|[^'"$\s/-]+|.""",
                        re.S)


def sql_compact(sql: str) -> str:
    """``sql`` without its comments and with each run of whitespace as one space (string literals,
    quoted identifiers and dollar-quoted bodies kept as they are): what is sent to the server. psycopg
    caches its conversion of a statement's placeholders only for text under 4 KiB
    (``MAX_CACHED_STATEMENT_LENGTH``), and the push claim with its comments was 5.4 KiB: converted
    again at every execution, 16 % of a push dispatcher's CPU."""
    out: list[str] = []
    space = False
    for match in _SQL_TOKEN.finditer(sql):
        token = match.group(0)
        if token.startswith("--") or token.startswith("/*") or token.isspace():
            space = True
            continue
        # no space after "(" or ",", nor before ")" or ",": delimiters in SQL, never part of a word
        if space and out and not out[-1].endswith(("(", ",")) and not token.startswith((")", ",")):
            out.append(" ")
        out.append(token)
        space = False
    return "".join(out)


@dataclass(frozen=True)
class Query:
    name: str
    sql: str  # as sent: comments removed, whitespace collapsed (``sql_compact``); ``text`` as written
    index: str
    hot: bool
    doc: str
    settings: tuple[tuple[str, str], ...] = ()
    text: str = ""  # the statement as written in the file, comments included

    def __str__(self) -> str:
        return self.sql


class QueryFileError(ValueError):
    """A queries file that breaks the format (the message names the file and line)."""


def queries_parse(text: str, *, source: str = "<queries>") -> dict[str, Query]:
    """The blocks of a queries file, by name (see the module docstring for the format)."""
    blocks: list[tuple[str, int, list[str]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        match = _NAME.match(line.strip())
        if match:
            blocks.append((match.group(1), number, []))
        elif blocks:
            blocks[-1][2].append(line.rstrip())
        elif line.strip() and not line.strip().startswith("--"):
            raise QueryFileError(f"{source}:{number}: SQL before the first '-- name --' line")
    names = [name for name, _, _ in blocks]
    for name, number, _ in blocks:
        if names.count(name) > 1:
            raise QueryFileError(f"{source}:{number}: query {name!r} is defined twice")
    fragments: dict[str, str] = {}
    for name, number, lines in blocks:
        first = next((line.strip() for line in lines if line.strip()), "")
        if _FRAGMENT.match(first):
            body = [line for line in lines if line.strip() and not line.strip().startswith("--")]
            fragments[name] = "\n".join(lines[lines.index(body[0]):]).strip() if body else ""
            if not fragments[name]:
                raise QueryFileError(f"{source}:{number}: fragment {name!r} has no SQL")
    used: set[str] = set()

    def fill(match: re.Match) -> str:
        if match.group(1) not in fragments:
            raise QueryFileError(f"{source}: no fragment named {match.group(1)!r}")
        used.add(match.group(1))
        return fragments[match.group(1)] + "\n"  # (a comment on its last line ends there)

    queries: dict[str, Query] = {}
    for name, number, lines in blocks:
        if name in fragments:
            continue
        queries[name] = _block(name, _USE.sub(fill, "\n".join(lines)).split("\n"), where=f"{source}:{number}")
    if unused := sorted(set(fragments) - used):
        raise QueryFileError(f"{source}: fragment {unused[0]!r} is never used")
    return queries


def _block(name: str, lines: list[str], *, where: str) -> Query:
    index, hot, doc, settings = None, False, [], []
    body_start = len(lines)
    for i, line in enumerate(lines):
        text = line.strip()
        if not text.startswith("--"):
            if text:
                body_start = i
                break
            continue
        if (match := _INDEX.match(text)) is not None:
            index = match.group(1)
        elif _HOT.match(text):
            hot = True
        elif (match := _SETTINGS.match(text)) is not None:
            for part in match.group(1).split(","):
                setting = _SETTING.match(part.strip())
                if setting is None:
                    raise QueryFileError(f"{where}: query {name!r}: setting {part.strip()!r} is not name=value")
                settings.append((setting.group(1), setting.group(2)))
        else:
            doc.append(text[2:].strip())
    sql = "\n".join(lines[body_start:]).strip()
    if sql.endswith(";"):
        sql = sql[:-1].rstrip()
    if not index:
        raise QueryFileError(f"{where}: query {name!r} has no '-- index:' line (name the index, 'pk', "
                             "or 'none (why)')")
    if not sql:
        raise QueryFileError(f"{where}: query {name!r} has no SQL")
    return Query(name=name, sql=sql_compact(sql), index=index, hot=hot, doc=" ".join(doc), settings=tuple(settings),
                 text=sql)


def queries_load(path: str | Path) -> dict[str, Query]:
    """Parse the queries file at ``path``."""
    path = Path(path)
    return queries_parse(path.read_text(encoding="utf-8"), source=str(path))


class Registry:
    """An app's queries by attribute (``Q.claim_pull``); iterating yields the Query objects."""

    def __init__(self, queries: dict[str, Query]) -> None:
        self._queries = dict(queries)

    def __getattr__(self, name: str) -> Query:
        try:
            return self.__dict__["_queries"][name]
        except KeyError:
            raise AttributeError(f"no query named {name!r}") from None

    def __iter__(self):
        return iter(self._queries.values())

    def __len__(self) -> int:
        return len(self._queries)

    def __contains__(self, name: str) -> bool:
        return name in self._queries


def app_queries(module_file: str) -> tuple[dict[str, Query], Registry]:
    """``ALL, Q`` of the app whose ``queries.py`` is ``module_file`` (its ``queries.sql`` beside it)."""
    queries = queries_load(Path(module_file).with_name("queries.sql"))
    return queries, Registry(queries)
