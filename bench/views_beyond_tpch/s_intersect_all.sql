CREATE VIEW s_intersect_all AS
SELECT l_orderkey % 1000 AS b FROM lineitem
INTERSECT ALL SELECT o_orderkey % 1000 FROM orders WHERE o_orderpriority = '1-URGENT'
