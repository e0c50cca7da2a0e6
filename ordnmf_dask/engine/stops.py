"""How a fit stopped, in the words its log line and the CLI print (from the fit's
``stop_reason``: ``engine.cavi.CaviState``)."""

from __future__ import annotations

STOP_WORDS = {
    "tol": "converged",
    "max_iter": "stopped at max_iter",
    "patience": "stopped early on validation (patience)",
    "callback": "stopped by the callback",
}


def stop_words(reason: str | None, converged: bool) -> str:
    """The words for ``reason``; a model whose record has none (older models) by
    ``converged``."""
    if reason in STOP_WORDS:
        return STOP_WORDS[reason]
    return STOP_WORDS["tol" if converged else "max_iter"]
