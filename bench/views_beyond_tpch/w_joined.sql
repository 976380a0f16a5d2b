CREATE VIEW w_joined AS
SELECT c_custkey, c_nationkey, o_orderkey,
       row_number() OVER (PARTITION BY c_nationkey, c_custkey ORDER BY o_orderdate DESC, o_orderkey) AS recent
FROM customer JOIN orders ON o_custkey = c_custkey
