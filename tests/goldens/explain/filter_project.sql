-- title: WHERE and scalar expressions over one source; only used columns are read
-- sources: orders(o_orderkey, o_custkey, o_orderstatus, o_totalprice, o_orderdate, o_comment)
CREATE VIEW open_orders AS
SELECT o.o_orderkey, o.o_totalprice * 1.1 AS total_with_tax,
       CASE WHEN o.o_totalprice > 100000 THEN 'large' ELSE 'small' END AS size,
       upper(o_comment) AS comment
FROM orders AS o
WHERE o.o_orderstatus = 'O' AND o_orderdate >= DATE '1995-01-01'
