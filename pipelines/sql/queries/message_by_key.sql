-- Messages by key or id, with their consume-queue position.
--
-- Every record whose KEYS contain ${key}, or whose UNIQ_KEY (the client message id) or offset
-- message id (the broker message id) is ${key}, next to the ConsumeQueue unit that points at it:
-- the join is on broker and commitlog offset. A record no unit points at (a transaction's
-- PREPARED or ROLLBACK half) has NULLs on the right; a unit without its record is not listed
-- (see the audit's cq_dangling_unit findings for those).
--
-- Run:     rocketlake sql --lake LAKE --saved message_by_key --param key=order-1
-- Tables:  messages, consume_queue
-- Engines: duckdb, datafusion, spark
-- @param key = order-1 | a KEYS value, a UNIQ_KEY or an offset message id
SELECT m.broker_name,
       m.topic,
       m.real_topic,
       m.queue_id,
       m.queue_offset,
       m.commitlog_offset,
       m.store_time,
       m.tags,
       m.keys,
       m.uniq_key,
       m.offset_msg_id,
       c.topic        AS cq_topic,
       c.queue_id     AS cq_queue_id,
       c.queue_offset AS cq_queue_offset,
       c.size         AS cq_size,
       c.tags_code    AS cq_tags_code
FROM messages m
LEFT JOIN consume_queue c
       ON c.broker_name = m.broker_name
      AND c.commitlog_offset = m.commitlog_offset
WHERE array_contains(m.keys, '${key}')
   OR m.uniq_key = '${key}'
   OR m.offset_msg_id = '${key}'
ORDER BY m.broker_name, m.commitlog_offset;
