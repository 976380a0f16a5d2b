-- TPC-H-style revenue per market segment and order priority: accumulable aggregates over a
-- three-way join (sums, counts and an exact DECIMAL average, kept as per-group sums).
CREATE VIEW revenue_by_segment AS
SELECT c.c_mktsegment, o.o_orderpriority,
       count(*) AS line_items,
       sum(l.l_extendedprice * (1 - l.l_discount)) AS revenue,
       avg(l.l_discount) AS avg_discount,
       count(DISTINCT o.o_orderkey) AS orders
FROM customer c
JOIN orders o ON c.c_custkey = o.o_custkey
JOIN lineitem l ON l.l_orderkey = o.o_orderkey
GROUP BY c.c_mktsegment, o.o_orderpriority
