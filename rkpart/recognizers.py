"""Kept for plugins: the recogniser helpers ``docs/plugins.md`` names, at the path plugins import.

They live in :mod:`rkpart.discovery.recognizers`; ``from rkpart.recognizers import relabel,
structural, discovery_from_blocks, ScopeRecognizer`` keeps working (``tests/plugins`` checks it).
"""

from rkpart.discovery.recognizers import (
    BUILTIN,
    Recognizer,
    ScopeRecognizer,
    check_discovery,
    discover,
    discovery_from_blocks,
    installed,
    plugins,
    relabel,
    structural,
)

__all__ = ["BUILTIN", "Recognizer", "ScopeRecognizer", "check_discovery", "discover", "discovery_from_blocks",
           "installed", "plugins", "relabel", "structural"]
