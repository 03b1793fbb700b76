"""``format = "text"``: the body as one UTF-8 string column ``text``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import pyarrow as pa

from pipelines.payloads.codec import Decoded, as_binary, utf8_failures

TEXT_COLUMN = "text"
TEXT_SCHEMA = pa.schema([pa.field(TEXT_COLUMN, pa.string(), metadata={"comment": "the body as UTF-8 text"})])


@dataclass(frozen=True)
class TextCodec:
    """Bodies that must be valid UTF-8; anything else is a failure naming the first bad byte."""

    format: str = "text"

    @property
    def schema(self) -> pa.Schema:
        return TEXT_SCHEMA

    def decode(self, bodies: "pa.Array | Sequence[bytes]") -> Decoded:
        binary = as_binary(bodies)
        failures = utf8_failures(binary)
        if failures:
            keep = Decoded(TEXT_SCHEMA.empty_table(), failures).ok_mask(len(binary))
            binary = binary.filter(pa.array(keep))
        text = binary.view(pa.string()).fill_null("")
        return Decoded(pa.Table.from_arrays([text], schema=TEXT_SCHEMA), failures)
