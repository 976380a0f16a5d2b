-- title: a view over a view reads the upstream view's updates; Project/Filter fuse
-- sources: orders(o_orderkey, o_custkey, o_totalprice, o_orderstatus)
CREATE VIEW open_orders AS
SELECT o_orderkey, o_custkey, o_totalprice FROM orders WHERE o_orderstatus = 'O';
CREATE VIEW big_open AS
SELECT o_orderkey, o_totalprice / 1000 AS k_price
FROM (SELECT * FROM open_orders WHERE o_totalprice > 1000) t
WHERE o_custkey IS NOT NULL
