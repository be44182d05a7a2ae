"""docs/methods.md states key defaults by hand; this test reads every one of them and compares it with the
key tables (fedpers/core/schema.py, fedpers/algorithms/<method>.py), so a changed default cannot leave the
docs behind. A default is written "`key` VALUE" (also "`key` = VALUE") in prose and cells, or as the first
number of the value cell of a "| `key` | ... |" row (a number in parentheses first: "= `lr` (0.015)");
"`key: value`" is a setting to use, not a default, and is not read."""

from __future__ import annotations

import re

import pytest

from fedpers.registry.config import full_schema
from tests.import_graph import ROOT

NUMBER = r"(-?\d+(?:\.\d+)?)"


def stated_defaults(text: str) -> list[tuple[str, str]]:
    """(key, value) for every default the text states in one of the two forms (see the module docstring)."""
    found = [(m.group(1), m.group(2)) for m in re.finditer(r"`(\w+)`(?: =)? " + NUMBER + r"(?![\w.%])", text)]
    for m in re.finditer(r"^\| `(\w+)`(?:, `\w+`)* \| ([^|]+)\|", text, re.M):
        number = re.search(r"\(" + NUMBER + r"\)|^\s*" + NUMBER, m.group(2))
        if number:
            found.append((m.group(1), number.group(1) or number.group(2)))
    return found


def mismatches(stated: list[tuple[str, str]], defaults: dict) -> list[str]:
    """The stated defaults of known keys that differ from the key tables' defaults."""
    return [f"`{key}` {value} in docs/methods.md, {defaults[key]!r} in its key table" for key, value in stated
            if key in defaults and float(value) != float(defaults[key])]


def test_every_default_docs_methods_states_is_the_key_tables_default():
    defaults = full_schema().defaults()
    stated = stated_defaults((ROOT / "docs" / "methods.md").read_text())
    named = {key for key, _ in stated if key in defaults}
    assert len(named) >= 33, sorted(named)  # what the docs state today: the test reads them all
    assert mismatches(stated, defaults) == []


@pytest.mark.parametrize("text, expected", [
    ("`ditto_lambda` 0.1 (ours)", [("ditto_lambda", "0.1")]),
    ("| `recal_lr` | = `lr` (0.015) | plain SGD |", [("recal_lr", "0.015")]),
    ("| `ea_steps`, `ea_lr` | 10 steps, = `lr` | ... |", [("ea_steps", "10")]),
    ("with `variant: ea`; `pfedme_k` 5, `moon_tau` = 0.5", [("pfedme_k", "5"), ("moon_tau", "0.5")]),
    ("`alpha` 0.5% of", []),
])
def test_the_reader_finds_both_forms_and_nothing_else(text, expected):
    assert stated_defaults(text) == expected


def test_a_changed_default_is_reported_naming_the_key():
    assert mismatches([("ditto_lambda", "0.2"), ("unknown", "1")], {"ditto_lambda": 0.1}) == [
        "`ditto_lambda` 0.2 in docs/methods.md, 0.1 in its key table"]
