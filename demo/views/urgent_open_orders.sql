-- A view over a view: large urgent orders among the open ones.
CREATE VIEW urgent_open_orders AS
SELECT o_orderkey, o_custkey, o_totalprice
FROM open_orders
WHERE o_orderpriority = '1-URGENT' AND o_totalprice > 300000
