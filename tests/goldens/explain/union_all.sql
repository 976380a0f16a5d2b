-- title: UNION ALL aligns branches by position and names columns after the first
-- sources: orders(o_orderkey, o_orderdate); lineitem(l_orderkey, l_shipdate, l_quantity)
CREATE VIEW events AS
SELECT o_orderkey AS k, 'order' AS kind, o_orderdate AS day FROM orders
UNION ALL
SELECT l_orderkey, 'ship', l_shipdate FROM lineitem WHERE l_quantity > 10
