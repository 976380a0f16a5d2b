-- A three-way delta join: late line items of open orders of BUILDING customers.
CREATE VIEW building_open_lines AS
SELECT c.c_custkey, c.c_name, o.o_orderkey, o.o_orderdate, l.l_linenumber,
       l.l_extendedprice * (1 - l.l_discount) AS revenue
FROM customer c
JOIN orders o ON c.c_custkey = o.o_custkey
JOIN lineitem l ON l.l_orderkey = o.o_orderkey
WHERE c.c_mktsegment = 'BUILDING' AND o.o_orderstatus = 'O'
  AND l.l_commitdate < l.l_receiptdate
