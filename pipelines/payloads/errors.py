"""The one error class users see for payload declarations and schema changes."""

from __future__ import annotations


class PayloadSchemaError(ValueError):
    """A declaration, payload schema or schema change that cannot be used. The message is one line
    naming what is wrong and where (file, topic, field): the CLI prints it as it is."""
