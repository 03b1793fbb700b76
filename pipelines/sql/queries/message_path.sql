-- The full path of one message through retries, delays and the dead-letter queue.
--
-- Give any id of the message: its UNIQ_KEY (client message id, kept on every redelivery), the
-- offset message id of the original record, or of any retry/DLQ record. Every record of the same
-- message is listed in store order: the original send, each SCHEDULE_TOPIC_XXXX record waiting
-- for redelivery (with its delay level), each %RETRY%<group> redelivery, and the %DLQ%<group>
-- record where it ended. Records are linked by UNIQ_KEY and by ORIGIN_MESSAGE_ID (the broker
-- sets it on every record it sends back to the original's offset message id), so a message
-- sent without a UNIQ_KEY is still followed. A transaction's half and commit records share the
-- UNIQ_KEY and show up too.
--
-- Run:     rocketlake sql --lake LAKE --saved message_path --param id=0A01020310921234ABCD47B760BA000D
-- Tables:  messages
-- Engines: duckdb, datafusion, spark
-- @param id | UNIQ_KEY, or offset message id of the original or of any retry/DLQ record
WITH hit AS (
    SELECT uniq_key,
           COALESCE(origin_msg_id, offset_msg_id) AS origin_id
    FROM messages
    WHERE uniq_key = '${id}'
       OR offset_msg_id = '${id}'
       OR origin_msg_id = '${id}'
), ids AS (
    SELECT uniq_key AS id FROM hit WHERE uniq_key IS NOT NULL
    UNION
    SELECT origin_id AS id FROM hit WHERE origin_id IS NOT NULL
), path AS (
    SELECT m.*
    FROM messages m
    WHERE m.uniq_key IN (SELECT id FROM ids)
       OR m.offset_msg_id IN (SELECT id FROM ids)
       OR m.origin_msg_id IN (SELECT id FROM ids)
)
SELECT ROW_NUMBER() OVER (ORDER BY store_time, commitlog_offset) AS step,
       CASE
           WHEN is_dlq THEN 'dead letter'
           WHEN topic = 'SCHEDULE_TOPIC_XXXX' THEN 'scheduled'
           WHEN is_retry THEN 'redelivered'
           WHEN topic = 'RMQ_SYS_TRANS_HALF_TOPIC' THEN 'transaction half'
           ELSE 'sent'
       END AS stage,
       broker_name,
       topic,
       real_topic,
       queue_id,
       queue_offset,
       commitlog_offset,
       store_time,
       reconsume_times,
       properties['DELAY']       AS delay_level,
       properties['RETRY_TOPIC'] AS retry_topic,
       consumer_group,
       uniq_key,
       offset_msg_id,
       origin_msg_id
FROM path
ORDER BY step;
