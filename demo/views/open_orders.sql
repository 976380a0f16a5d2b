-- Orders still open, with their priority.
CREATE VIEW open_orders AS
SELECT o_orderkey, o_custkey, o_totalprice, o_orderdate, o_orderpriority
FROM orders
WHERE o_orderstatus = 'O'
