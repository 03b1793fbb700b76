-- Audit findings by kind.
--
-- Per broker and finding kind (crc_mismatch, corrupt_region, cq_dangling_unit, …; see
-- pipelines/reports/audit.py) of the latest `rocketlake audit` of each broker: how many, in how
-- many files, the first finding's file, offset and detail as an example, and when it was audited.
-- Every finding with its detail:
--     SELECT * FROM audit_findings a WHERE a.kind = 'crc_mismatch' ORDER BY a.broker_name, a.file, a.offset;
-- ("offset" is a reserved word in DuckDB: write it qualified, a.offset, as below.)
--
-- Run:     rocketlake sql --lake LAKE --saved audit_findings_by_kind
-- Tables:  audit_findings
-- Engines: duckdb, datafusion, spark
WITH numbered AS (
    SELECT a.broker_name,
           a.kind,
           a.file,
           a.offset AS file_offset,
           a.detail,
           a.audited_at,
           ROW_NUMBER() OVER (PARTITION BY a.broker_name, a.kind ORDER BY a.file, a.offset, a.detail) AS n
    FROM audit_findings a
)
SELECT broker_name,
       kind,
       COUNT(*)                                        AS findings,
       COUNT(DISTINCT file)                            AS files,
       MAX(CASE WHEN n = 1 THEN file END)              AS example_file,
       MAX(CASE WHEN n = 1 THEN file_offset END)       AS example_offset,
       MAX(CASE WHEN n = 1 THEN detail END)            AS example_detail,
       MAX(audited_at)                                 AS audited_at
FROM numbered
GROUP BY broker_name, kind
ORDER BY findings DESC, broker_name, kind;
