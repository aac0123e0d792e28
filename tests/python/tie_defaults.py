"""The committed crates/devmap-core/src/formats/tie_defaults.txt against the installed transformers: the
list of model types whose config defaults tie_word_embeddings to false must be the one
transformers has (regenerate with scripts/gen_tie_defaults.py after an upgrade).

Usage: python tie_defaults.py PATH/TO/devmap   (devmap is not needed; kept for symmetry)
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
from gen_tie_defaults import render, untied_model_types  # noqa: E402


def main():
    here = os.path.join(os.path.dirname(__file__), "..", "..", "crates", "devmap-core", "src", "formats", "tie_defaults.txt")
    with open(here) as f:
        committed = f.read()
    fresh = render()
    if committed != fresh:
        old = {l for l in committed.splitlines() if not l.startswith("#")}
        new = set(untied_model_types())
        raise SystemExit(
            "crates/devmap-core/src/formats/tie_defaults.txt is not what this transformers says; run "
            f"scripts/gen_tie_defaults.py (now untied: {sorted(new - old)}, no longer: {sorted(old - new)})")
    count = sum(1 for l in committed.splitlines() if not l.startswith("#"))
    print(f"ok: {count} model types default to untied embeddings, as committed")


if __name__ == "__main__":
    main()
