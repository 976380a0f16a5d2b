-- title: one GROUP BY, every aggregate kind: accumulable, hierarchical (tower), basic, DISTINCT; collated
-- sources: lineitem(l_orderkey, l_returnflag, l_linestatus, l_quantity, l_extendedprice, l_discount, l_shipdate, l_comment)
-- ivm: expected_group_size = 2000000
CREATE VIEW pricing_summary AS
SELECT l_returnflag, l_linestatus,
       sum(l_quantity) AS sum_qty,
       sum(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
       avg(l_discount) AS avg_disc,
       count(*) AS count_order,
       min(l_shipdate) AS first_ship, max(l_shipdate) AS last_ship,
       count(DISTINCT l_orderkey) AS orders,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY l_quantity) AS median_qty
FROM lineitem
WHERE l_shipdate <= DATE '1998-09-02'
GROUP BY l_returnflag, l_linestatus
HAVING count(*) > 10
