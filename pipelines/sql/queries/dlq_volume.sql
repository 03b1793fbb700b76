-- Dead-letter volume by day, group and original topic.
--
-- One row per UTC day, broker, consumer group and original topic of the messages that reached a
-- %DLQ%<group> topic (as of the last `rocketlake dlq` run): how many, how many distinct originals,
-- the first and last arrival, and how many a replay has sent back since. Newest day first.
-- dlq_summary holds the same per-day counts with time-to-DLQ percentiles and top keys/tags:
--     SELECT * FROM dlq_summary ORDER BY store_date DESC, messages DESC;
--
-- Run:     rocketlake sql --lake LAKE --saved dlq_volume --param since=2026-11-01
-- Tables:  dlq_messages
-- Engines: duckdb, datafusion, spark
-- @param since = 1970-01-01 | first UTC day to count (YYYY-MM-DD)
SELECT store_date,
       broker_name,
       consumer_group,
       original_topic,
       COUNT(*)                        AS messages,
       COUNT(DISTINCT original_msg_id) AS distinct_originals,
       MIN(dlq_store_time)             AS first_dlq_time,
       MAX(dlq_store_time)             AS last_dlq_time,
       CAST(SUM(CASE WHEN replay_run_id IS NOT NULL THEN 1 ELSE 0 END) AS BIGINT) AS replayed
FROM dlq_messages
WHERE store_date >= CAST('${since}' AS DATE)
GROUP BY store_date, broker_name, consumer_group, original_topic
ORDER BY store_date DESC, messages DESC, broker_name, consumer_group, original_topic;
