-- Global top-k: the ten largest orders (ties broken by order key).
CREATE VIEW largest_orders AS
SELECT o_orderkey, o_custkey, o_totalprice, o_orderdate
FROM orders
ORDER BY o_totalprice DESC, o_orderkey
LIMIT 10
