-- Topics by bytes per day.
--
-- Per UTC day, broker and topic the producer sent to (real_topic: REAL_TOPIC for delayed,
-- retried and transaction half records), the records and their bytes in the CommitLog
-- (store_size: the whole record, headers and properties included), from the messages table, so
-- it is current as of the last ingest. Biggest first within a day.
-- topic_daily_stats (written by `rocketlake audit`) holds the same counts plus the body bytes:
--     SELECT store_date, broker_name, topic, messages, bytes, body_bytes FROM topic_daily_stats
--     ORDER BY store_date, bytes DESC;
-- (Body length has no function common to the three engines: octet_length(body) on DuckDB and
-- Spark, length(encode(body, 'hex')) / 2 on DataFusion.)
--
-- Run:     rocketlake sql --lake LAKE --saved topic_bytes_per_day --param since=2026-11-01
-- Tables:  messages
-- Engines: duckdb, datafusion, spark
-- @param since = 1970-01-01 | first UTC day to count (YYYY-MM-DD)
SELECT store_date,
       broker_name,
       real_topic                          AS topic,
       COUNT(*)                            AS messages,
       CAST(SUM(store_size) AS BIGINT)     AS bytes,
       COUNT(DISTINCT born_host)           AS producers,
       MIN(store_time)                     AS first_store_time,
       MAX(store_time)                     AS last_store_time
FROM messages
WHERE store_date >= CAST('${since}' AS DATE)
GROUP BY store_date, broker_name, real_topic
ORDER BY store_date, bytes DESC, broker_name, topic;
