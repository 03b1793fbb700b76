"""Delay levels (``messageDelayLevel``) and the deliver time stored as a delay-topic tagsCode."""

from __future__ import annotations

from broker.store.constants import DEFAULT_MESSAGE_DELAY_LEVEL, PROPERTY_DELAY

_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(spec: str = DEFAULT_MESSAGE_DELAY_LEVEL) -> list[int]:
    """``"1s 5s … 2h"`` → delay in ms per level (index 0 = level 1), like ScheduleMessageService."""
    levels = []
    for i, item in enumerate(spec.split()):
        unit = item[-1:].lower()
        if unit not in _UNIT_MS or not item[:-1].isdigit():
            raise ValueError(f"messageDelayLevel item {i + 1} {item!r} is not <number><s|m|h|d>")
        levels.append(int(item[:-1]) * _UNIT_MS[unit])
    if not levels:
        raise ValueError("messageDelayLevel is empty")
    return levels


def clamp_level(level: int, levels: list[int]) -> int:
    """Levels above the highest are clamped to it (CommitLog.asyncPutMessage)."""
    return min(level, len(levels))


def deliver_timestamp(store_timestamp: int, level: int, levels: list[int]) -> int:
    """tagsCode of a SCHEDULE_TOPIC_XXXX unit: store time + the level's delay."""
    return store_timestamp + levels[clamp_level(level, levels) - 1]


def delay_level_of(props: dict[str, str]) -> int | None:
    """The ``DELAY`` property as Java's ``Integer.parseInt`` reads it (0 if absent, None if invalid)."""
    text = props.get(PROPERTY_DELAY)
    if text is None:
        return 0
    try:
        value = int(text, 10)
    except ValueError:
        return None
    return value if -(1 << 31) <= value < (1 << 31) and text.strip() == text and "_" not in text else None
