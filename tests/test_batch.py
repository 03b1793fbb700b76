"""Batch wire bodies: round trip and malformed input."""

import pytest

from broker.store.batch import BatchFormatError, BatchItem, decode_batch, encode_batch
from broker.store.crc import body_crc


def test_round_trip_bytes_and_fields():
    items = [BatchItem(b"", ""), BatchItem("héllo 🚀".encode(), "KEYS\x01k1 k2\x02TAGS\x01标签", flag=-3),
             BatchItem(bytes(range(256)) * 10, "WAIT\x01true")]
    body = encode_batch(items)
    back = decode_batch(body)
    assert [(i.body, i.properties_raw, i.flag) for i in back] == [(i.body, i.properties_raw, i.flag) for i in items]
    assert [i.body_crc for i in back] == [body_crc(i.body) for i in items]
    assert encode_batch(back) == body


@pytest.mark.parametrize("cut, offset", [(5, 0), (40, 0)])
def test_truncated_body_names_offset(cut, offset):
    body = encode_batch([BatchItem(b"x" * 30, "a\x01b")])
    with pytest.raises(BatchFormatError) as err:
        decode_batch(body[:cut])
    assert err.value.offset == offset


def test_lying_lengths():
    good = encode_batch([BatchItem(b"abc", "k\x01v")])
    second = bytearray(encode_batch([BatchItem(b"abc", "k\x01v")]))
    second[16:20] = (1000).to_bytes(4, "big")  # BODYLEN past the item
    with pytest.raises(BatchFormatError, match="BODYLEN 1000") as err:
        decode_batch(good + bytes(second))
    assert err.value.offset == len(good)
