-- title: EXISTS and NOT EXISTS become semi/anti joins maintained by per-key match counts
-- sources: orders(o_orderkey, o_custkey, o_orderstatus); lineitem(l_orderkey, l_quantity); customer(c_custkey, c_mktsegment)
CREATE VIEW orders_with_big_lines AS
SELECT o_orderkey FROM orders o
WHERE o.o_orderstatus = 'O' AND EXISTS (SELECT 1 FROM lineitem l WHERE l.l_orderkey = o.o_orderkey AND l.l_quantity > 45);
CREATE VIEW orders_without_lines AS
SELECT o_orderkey FROM orders WHERE NOT EXISTS (SELECT * FROM lineitem WHERE l_orderkey = o_orderkey);
CREATE VIEW building_orders AS
SELECT o_orderkey FROM orders WHERE o_custkey IN (SELECT c_custkey FROM customer WHERE c_mktsegment = 'BUILDING')
;
CREATE VIEW orders_of_unknown_customers AS
SELECT o_orderkey FROM orders WHERE o_custkey NOT IN (SELECT c_custkey FROM customer WHERE c_mktsegment = 'AUTOMOBILE')
