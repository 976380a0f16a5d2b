-- Revenue and charge of returned line items shipped since 1995 (TPC-H Q1/Q10 expressions).
CREATE VIEW returned_revenue AS
SELECT l_orderkey,
       l_linenumber,
       l_extendedprice * (1 - l_discount) AS revenue,
       l_extendedprice * (1 - l_discount) * (1 + l_tax) AS charge,
       l_shipdate
FROM lineitem
WHERE l_returnflag = 'R' AND l_shipdate >= DATE '1995-01-01'
