-- Top lagging consumer groups now, and which way their lag is going.
--
-- From the consumer_lag snapshots (one per `rocketlake lag` run): per broker and group, the lag
-- summed over its queues and the worst lag in seconds, in its newest snapshot; the change since
-- the snapshot before it and since the oldest of the last ${window} snapshots; and a trend word
-- (growing, shrinking, steady; new when there is only one snapshot). Biggest lag first.
--
-- Run:     rocketlake sql --lake LAKE --saved lagging_groups --param top=5
-- Tables:  consumer_lag
-- Engines: duckdb, datafusion, spark
-- @param top = 10 | groups to list
-- @param window = 6 | snapshots the window change looks back over
WITH per_snapshot AS (
    SELECT broker_name,
           consumer_group,
           snapshot_ts,
           SUM(lag_messages) AS lag_messages,
           MAX(lag_seconds)  AS max_lag_seconds,
           COUNT(*)          AS queues
    FROM consumer_lag
    GROUP BY broker_name, consumer_group, snapshot_ts
), ranked AS (
    SELECT broker_name,
           consumer_group,
           snapshot_ts,
           lag_messages,
           max_lag_seconds,
           queues,
           ROW_NUMBER() OVER (PARTITION BY broker_name, consumer_group ORDER BY snapshot_ts DESC) AS age,
           COUNT(*) OVER (PARTITION BY broker_name, consumer_group) AS snapshots
    FROM per_snapshot
)
SELECT cur.broker_name,
       cur.consumer_group,
       cur.snapshot_ts                        AS latest_snapshot,
       cur.queues,
       CAST(cur.lag_messages AS BIGINT)       AS lag_messages,
       cur.max_lag_seconds,
       CAST(cur.lag_messages - prev.lag_messages AS BIGINT) AS change_since_previous,
       CAST(cur.lag_messages - win.lag_messages AS BIGINT)  AS change_over_window,
       win.snapshot_ts                        AS window_start,
       CASE
           WHEN prev.lag_messages IS NULL THEN 'new'
           WHEN cur.lag_messages > prev.lag_messages THEN 'growing'
           WHEN cur.lag_messages < prev.lag_messages THEN 'shrinking'
           ELSE 'steady'
       END                                    AS trend
FROM ranked cur
LEFT JOIN ranked prev
       ON prev.broker_name = cur.broker_name
      AND prev.consumer_group = cur.consumer_group
      AND prev.age = 2
LEFT JOIN ranked win
       ON win.broker_name = cur.broker_name
      AND win.consumer_group = cur.consumer_group
      AND win.age = LEAST(cur.snapshots, ${window})
WHERE cur.age = 1
ORDER BY lag_messages DESC, broker_name, consumer_group
LIMIT ${top};
