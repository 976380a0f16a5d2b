CREATE VIEW b_priorities AS
SELECT o_custkey, count(*) AS orders,
       listagg(DISTINCT o_orderpriority, ',') WITHIN GROUP (ORDER BY o_orderpriority) AS priorities
FROM orders GROUP BY o_custkey
