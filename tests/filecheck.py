"""A small FileCheck (in the spirit of LLVM's) for the ``tests/kir/*.kir`` pass tests.

Directives are read from comment lines of a check file (``// CHECK: ...``) and matched, in
order, against an output text:

- ``CHECK: pat``         pat occurs at or after the end of the previous match.
- ``CHECK-NEXT: pat``    pat occurs on the line right after the previous match's line.
- ``CHECK-SAME: pat``    pat occurs on the same line as the previous match, after it.
- ``CHECK-NOT: pat``     pat does not occur between the previous match and the next positive
                         match (or the end of the output / of the current label block).
- ``CHECK-COUNT-<n>: pat``  pat occurs ``n`` times, each after the previous occurrence (the
                         same as ``n`` consecutive ``CHECK:`` lines).
- ``CHECK-LABEL: pat``   pat occurs on exactly one line of the output. Labels are matched
                         first and cut the output into blocks; the checks after a label only
                         look inside its block, so a failure cannot wander into the next graph.

``implicit_check_not`` patterns (FileCheck's ``--implicit-check-not``) act as a ``CHECK-NOT``
placed before the first directive, between every two, and after the last: they must not occur
anywhere in the output outside the text matched by positive directives.

A pattern is literal text with ``{{regex}}`` blocks (Python regular expressions) and
variables: ``[[NAME:regex]]`` matches regex and binds NAME to the matched text, ``[[NAME]]``
matches exactly the text bound earlier. Runs of whitespace in literal text match any run of
horizontal whitespace, as in FileCheck without ``--strict-whitespace``. A failure raises
:class:`CheckFailure` naming the directive (its text and line in the check file) and showing
the output lines where matching stopped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_KINDS = r"CHECK(?:-NEXT|-SAME|-NOT|-LABEL|-COUNT-\d+)?"
_DIRECTIVE = re.compile(rf"^\s*//\s*(?P<kind>{_KINDS}):(?P<pattern>.*)$")
_LOOKS_LIKE_DIRECTIVE = re.compile(r"^\s*//\s*CHECK[-A-Za-z0-9]*:")
# a block ends at the last bracket of a '}}}...' / ']]]...' run, so '{{{.*}}}' means '{' '.*' '}'
# and '[[N:[0-9]]]' binds N to '[0-9]'
_TOKEN = re.compile(
    r"\{\{(?P<regex>.*?)\}\}(?!\})"
    r"|\[\[(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?::(?P<defn>.*?))?\]\](?!\])"
)


class CheckFailure(AssertionError):
    """A check did not hold; the message names the directive and the output position."""


@dataclass(frozen=True)
class Check:
    """One directive: its kind (``CHECK``, ``CHECK-NEXT``, ...), pattern text and origin."""

    kind: str
    pattern: str
    line: int  # 1-based line in the check file
    count: int = 1

    def describe(self) -> str:
        kind = f"CHECK-COUNT-{self.count}" if self.kind == "CHECK-COUNT" else self.kind
        return f"{kind}: {self.pattern.strip()} (check file line {self.line})"

    def uses_variables(self) -> bool:
        return any(m.group("name") for m in _TOKEN.finditer(self.pattern))

    def regex(self, variables: dict[str, str]) -> re.Pattern:
        """The pattern as a regex, with ``[[NAME]]`` replaced by the text bound so far."""
        return compile_pattern(self.pattern, variables, self.line)


def _literal(text: str) -> str:
    # whitespace runs match any horizontal whitespace run (FileCheck's default canonicalisation)
    return r"[ \t]+".join(re.escape(part) for part in re.split(r"\s+", text))


def compile_pattern(pattern: str, variables: dict[str, str] | None = None, line: int = 0) -> re.Pattern:
    """Literal text with ``{{regex}}`` and ``[[NAME(:regex)]]`` blocks -> a compiled regex."""
    variables = variables or {}
    where = f"check file line {line}: " if line else ""
    text = pattern.strip()
    if not text:
        raise ValueError(f"{where}empty check pattern")
    pieces: list[str] = []
    defined_here: set[str] = set()
    pos = 0
    for match in _TOKEN.finditer(text):
        pieces.append(_literal(text[pos : match.start()]))
        pos = match.end()
        if match.group("regex") is not None:
            regex = match.group("regex")
            _validate(regex, where, pattern)
            pieces.append(f"(?:{regex})")
            continue
        name, defn = match.group("name"), match.group("defn")
        if defn is not None:
            if name in defined_here:
                raise ValueError(f"{where}variable {name} defined twice in {pattern!r}")
            _validate(defn, where, pattern)
            defined_here.add(name)
            pieces.append(f"(?P<{name}>{defn})")
        elif name in defined_here:
            pieces.append(f"(?P={name})")
        elif name in variables:
            pieces.append(re.escape(variables[name]))
        else:
            raise ValueError(f"{where}variable {name} is used before it is defined")
    pieces.append(_literal(text[pos:]))
    if "{{" in text[pos:] or re.search(r"\[\[[A-Za-z_]", text[pos:]):
        raise ValueError(f"{where}unterminated '{{{{' or '[[' in pattern {pattern!r}")
    return re.compile("".join(pieces))


def _validate(regex: str, where: str, pattern: str) -> None:
    try:
        re.compile(regex)
    except re.error as err:
        raise ValueError(f"{where}bad regex {regex!r} in pattern {pattern!r}: {err}") from None


def parse_checks(check_text: str) -> list[Check]:
    """The directives of ``check_text`` in order; a misspelled ``CHECK...:`` line is an error."""
    checks: list[Check] = []
    for number, line in enumerate(check_text.split("\n"), start=1):
        match = _DIRECTIVE.match(line)
        if match is None:
            if _LOOKS_LIKE_DIRECTIVE.match(line):
                raise ValueError(f"check file line {number}: unknown directive: {line.strip()}")
            continue
        kind, pattern = match.group("kind"), match.group("pattern")
        count = 1
        if kind.startswith("CHECK-COUNT-"):
            count = int(kind[len("CHECK-COUNT-") :])
            if count < 1:
                raise ValueError(f"check file line {number}: CHECK-COUNT needs a positive count")
            kind = "CHECK-COUNT"
        check = Check(kind, pattern, number, count)
        check.regex({name: "" for name in _names(pattern)})  # syntax errors surface now
        if kind == "CHECK-LABEL" and check.uses_variables():
            raise ValueError(f"check file line {number}: CHECK-LABEL cannot use variables")
        checks.append(check)
    if not checks:
        raise ValueError("no CHECK directives found")
    if checks[0].kind in ("CHECK-NEXT", "CHECK-SAME"):
        raise ValueError(f"{checks[0].describe()}: {checks[0].kind} cannot be the first directive")
    return checks


def _names(pattern: str) -> list[str]:
    return [m.group("name") for m in _TOKEN.finditer(pattern) if m.group("name")]


def check(output: str, check_text: str, implicit_check_not: tuple[str, ...] | list[str] = ()) -> None:
    """Apply the directives in ``check_text`` to ``output``; raise :class:`CheckFailure` if one fails."""
    implicit = [Check("CHECK-NOT", pattern, 0) for pattern in implicit_check_not]
    for c in implicit:
        c.regex({})  # syntax errors surface now
    run_checks(output, parse_checks(check_text), implicit)


class _Output:
    """The output text as lines; positions are (0-based line, column)."""

    def __init__(self, text: str):
        self.lines = text.split("\n")

    def search(self, regex: re.Pattern, line: int, col: int, end_line: int):
        """First match at/after (line, col) on lines before end_line: a re.Match and its line."""
        for i in range(line, end_line):
            match = regex.search(self.lines[i], col if i == line else 0)
            if match:
                return i, match
        return None

    def excerpt(self, line: int, end_line: int, limit: int = 8) -> str:
        shown = self.lines[line : min(end_line, line + limit)]
        if not shown:
            return "  (end of output)"
        text = "\n".join(f"  {line + 1 + k:4d} | {s}" for k, s in enumerate(shown))
        more = end_line - line - len(shown)
        return text + (f"\n  ... ({more} more lines)" if more > 0 else "")


def run_checks(output: str, checks: list[Check], implicit_not: list[Check] = ()) -> None:
    """Match the parsed ``checks`` against ``output`` (see the module docstring)."""
    out = _Output(output)
    blocks: list[tuple[Check | None, list[Check]]] = [(None, [])]
    for c in checks:
        if c.kind == "CHECK-LABEL":
            blocks.append((c, []))
        else:
            blocks[-1][1].append(c)
    starts = [0]
    for label, _ in blocks[1:]:
        regex = label.regex({})
        hits = [i for i, s in enumerate(out.lines) if regex.search(s)]
        if not hits:
            raise CheckFailure(
                f"{label.describe()}: label not found in the output:\n{out.excerpt(0, len(out.lines))}"
            )
        if len(hits) > 1:
            raise CheckFailure(
                f"{label.describe()}: label matches {len(hits)} output lines "
                f"({', '.join(str(h + 1) for h in hits)}); a label must be unique"
            )
        if hits[0] < starts[-1]:
            raise CheckFailure(
                f"{label.describe()}: label found on output line {hits[0] + 1}, before the previous label"
            )
        starts.append(hits[0])
    starts.append(len(out.lines))
    variables: dict[str, str] = {}
    for k, (label, group) in enumerate(blocks):
        begin, end = starts[k], starts[k + 1]
        if label is None:
            _run_block(out, group, begin, 0, end, variables, implicit_not, have_match=False)
        else:
            # matching inside a block starts right after its label
            col = out.search(label.regex({}), begin, 0, begin + 1)[1].end()
            _run_block(out, group, begin, col, end, variables, implicit_not, have_match=True)


def _run_block(
    out: _Output,
    checks: list[Check],
    line: int,
    col: int,
    end: int,
    variables: dict[str, str],
    implicit_not: list[Check],
    have_match: bool,
) -> None:
    pending_not: list[Check] = list(implicit_not)

    def check_nots(upto_line: int, upto_col: int) -> None:
        # CHECK-NOT patterns must not occur in [previous match end, next match start)
        for c in pending_not:
            hit = out.search(c.regex(variables), line, col, min(upto_line + 1, end))
            if hit and (hit[0], hit[1].start()) < (upto_line, upto_col):
                what = c.describe() if c.line else f"implicit CHECK-NOT: {c.pattern}"
                raise CheckFailure(
                    f"{what}: excluded pattern found on output line "
                    f"{hit[0] + 1}:\n  {hit[0] + 1:4d} | {out.lines[hit[0]]}"
                )
        pending_not.clear()

    for c in checks:
        if c.kind == "CHECK-NOT":
            pending_not.append(c)
            continue
        for repeat in range(c.count):
            regex = c.regex(variables)
            if c.kind in ("CHECK-NEXT", "CHECK-SAME") and not have_match:
                raise CheckFailure(f"{c.describe()}: no previous match to follow")
            if c.kind == "CHECK-SAME":
                start = line
                hit = out.search(regex, line, col, line + 1)
            elif c.kind == "CHECK-NEXT":
                start = line + 1
                hit = out.search(regex, start, 0, start + 1) if start < end else None
            else:
                start = line
                hit = out.search(regex, line, col, end)
            if hit is None:
                what = {
                    "CHECK-NEXT": "not found on the next line",
                    "CHECK-SAME": "not found on the same line",
                }.get(c.kind, "not found")
                nth = f" (occurrence {repeat + 1} of {c.count})" if c.count > 1 else ""
                used = _names(c.pattern)
                bound = "".join(f"\n  with {k} = {v!r}" for k, v in variables.items() if k in used)
                raise CheckFailure(
                    f"{c.describe()}: {what}{nth}; searched from output line "
                    f"{start + 1}:{bound}\n{out.excerpt(min(start, end), end)}"
                )
            found_line, match = hit
            check_nots(found_line, match.start())
            variables.update({k: v for k, v in match.groupdict().items() if v is not None})
            line, col = found_line, match.end()
            have_match = True
            pending_not.extend(implicit_not)
    check_nots(end, 0)
