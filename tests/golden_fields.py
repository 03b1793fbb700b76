"""Map Apache's decoded view of a golden record onto rocketlake's field names (one place)."""

from __future__ import annotations

import base64

from broker.store.properties import split_keys


def expected_row(e: dict) -> dict:
    """The ``rocketlake store messages`` fields Apache's decoder implies for one record."""
    props = e["properties"]
    topic = e["topic"]
    real = props.get("REAL_TOPIC") if topic in ("SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC") else None
    return {
        "commitlog_offset": e["phyOffset"],
        "store_size": e["storeSize"],
        "magic_code": e["magicCode"],
        "body_crc": e["bodyCRC"],
        "body_crc_ok": e["bodyCRCValid"],
        "queue_id": e["queueId"],
        "flag": e["flag"],
        "queue_offset": e["queueOffset"],
        "sys_flag": e["sysFlag"],
        "transaction_type": e["transactionType"],
        "compression": e.get("compressionType", "NONE") if e["compressed"] else "NONE",
        "born_timestamp": e["bornTimestamp"],
        "store_timestamp": e["storeTimestamp"],
        "reconsume_times": e["reconsumeTimes"],
        "prepared_transaction_offset": e["preparedTransactionOffset"],
        "topic": topic,
        "real_topic": real or topic,
        "properties": props,
        "keys": split_keys(e.get("keys")),
        "tags": e.get("tags"),
        "uniq_key": e.get("uniqKey"),
        "offset_msg_id": e["offsetMsgId"],
        "body": base64.b64decode(e["bodyBase64"]),
    }


def java_host(text: str) -> tuple[str, int]:
    """Apache prints IPv6 hosts as 'a:b:…:h:port'; split into (address, port)."""
    addr, _, port = text.rpartition(":")
    return addr, int(port)
