CREATE VIEW w_grouped AS
SELECT o_custkey, o_orderpriority, count(*) AS n, sum(o_totalprice) AS s
FROM orders GROUP BY o_custkey, o_orderpriority
QUALIFY dense_rank() OVER (PARTITION BY o_custkey ORDER BY count(*) DESC) = 1
