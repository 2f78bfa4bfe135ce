"""What the safety-stage tests share: a batch of documents as the stage reads them."""

from __future__ import annotations

import pyarrow as pa

from tasks.schema import DOCUMENT_SCHEMA


def documents(texts: list[str], source: str = "web") -> pa.Table:
    """One document per text, with the columns every stage reads."""
    n = len(texts)
    return pa.table(
        [
            pa.array([f"id{i}" for i in range(n)]),
            pa.array([source] * n),
            pa.array(texts),
            pa.array([f"doc-{i}" for i in range(n)]),
            pa.array(['{"kind": "prose"}'] * n),
        ],
        schema=DOCUMENT_SCHEMA,
    )
