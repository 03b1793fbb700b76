-- Dead letters with their typed payload.
--
-- Every DLQ record whose original is still in the store, next to the original's row in a typed
-- payload table (payload_<topic>: a topic declared with `rocketlake schema install`), joined on
-- broker and the original's commitlog offset (dlq_messages.original_commitlog_offset). The
-- payload's own columns come last: filter on them in your own copy, e.g.
--     ... WHERE p.amount > 1000
-- Dead letters whose original body did not decode are in payload_quarantine, not here.
--
-- Run:     rocketlake sql --lake LAKE --saved dlq_payloads --param payload_table=payload_payments
-- Tables:  dlq_messages, payload_<topic>
-- Engines: duckdb, datafusion, spark
-- @param payload_table = payload_payments | the typed table of the dead letters' original topic
-- @param group = % | consumer group (a LIKE pattern)
SELECT d.consumer_group,
       d.original_topic,
       d.dlq_store_time,
       d.reconsume_times,
       d.dlq_commitlog_offset,
       p.*          -- broker_name, the original's commitlog_offset and metadata, then the payload
FROM dlq_messages d
JOIN ${payload_table} p
  ON p.broker_name = d.broker_name
 AND p.commitlog_offset = d.original_commitlog_offset
WHERE d.consumer_group LIKE '${group}'
ORDER BY d.dlq_store_time, d.dlq_commitlog_offset;
