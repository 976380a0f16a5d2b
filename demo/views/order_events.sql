-- UNION ALL: one row per order placed and per line item shipped in 1998.
CREATE VIEW order_events AS
SELECT o_orderkey AS orderkey, 'placed' AS event, o_orderdate AS day
FROM orders WHERE o_orderdate >= DATE '1998-01-01'
UNION ALL
SELECT l_orderkey, 'shipped', l_shipdate
FROM lineitem WHERE l_shipdate >= DATE '1998-01-01'
