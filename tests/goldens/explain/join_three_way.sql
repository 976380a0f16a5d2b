-- title: three-way join: one path per input, filters pushed to inputs, residual after both sides
-- sources: customer(c_custkey, c_name, c_mktsegment, c_acctbal); orders(o_orderkey, o_custkey, o_orderdate, o_orderstatus); lineitem(l_orderkey, l_linenumber, l_quantity, l_shipdate)
CREATE VIEW building_lines AS
SELECT c.c_name, o.o_orderkey, l.l_quantity
FROM customer c, orders o, lineitem l
WHERE c.c_custkey = o.o_custkey AND l.l_orderkey = o.o_orderkey
  AND c.c_mktsegment = 'BUILDING' AND o.o_orderstatus = 'O' AND o.o_orderdate < l.l_shipdate
