"""People's identities, compared the one way every rule about "two people" depends on.

A two-person rule is only as strong as the comparison behind it: if ``alice`` and ``Alice`` (or
``alice`` with a trailing space, a zero-width space, or a full-width ``ａｌｉｃｅ``) count as two
people, one person meets it alone. Every check that tells people apart (break-glass approvals in
the broker and the store, lever approvals, role holders, drill rotation) goes through
``canonical_identity``, so they cannot disagree on who is who.

The canonical form: Unicode NFKC (compatibility forms folded: full-width letters, ligatures),
format characters removed (zero-width spaces and joiners, bidi marks), case-folded (``ß`` and
``SS`` alike), NFKC again (case folding can denormalise), and whitespace stripped and collapsed.
It is used for comparing only; records keep the name as it was given.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

__all__ = ["canonical_identity", "distinct_people", "same_person"]


def canonical_identity(name: str) -> str:
    """The form two names take when they name the same person."""
    folded = unicodedata.normalize("NFKC", name)
    folded = "".join(ch for ch in folded if unicodedata.category(ch) != "Cf")
    folded = unicodedata.normalize("NFKC", folded.casefold())
    return " ".join(folded.split())


def same_person(a: str, b: str) -> bool:
    """Whether two names are the same person."""
    return canonical_identity(a) == canonical_identity(b)


def distinct_people(names: Iterable[str]) -> frozenset[str]:
    """The distinct people among ``names`` (canonical forms; blank names are nobody)."""
    return frozenset(c for c in (canonical_identity(n) for n in names) if c)
