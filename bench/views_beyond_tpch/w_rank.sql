CREATE VIEW w_rank AS
SELECT o_orderkey, o_custkey, o_totalprice,
       rank() OVER (PARTITION BY o_custkey ORDER BY o_totalprice DESC) AS r,
       sum(o_totalprice) OVER (PARTITION BY o_custkey) AS cust_total
FROM orders
