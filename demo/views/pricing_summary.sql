-- TPC-H Q1 (pricing summary) plus the first and last ship date of each group: MIN/MAX on a
-- 16-way tower, so deleting the current minimum re-examines a few entries per level only.
-- ivm: expected_group_size = 2000000
CREATE VIEW pricing_summary AS
SELECT l_returnflag, l_linestatus,
       sum(l_quantity) AS sum_qty,
       sum(l_extendedprice) AS sum_base_price,
       sum(l_extendedprice * (1 - l_discount)) AS sum_disc_price,
       sum(l_extendedprice * (1 - l_discount) * (1 + l_tax)) AS sum_charge,
       avg(l_quantity) AS avg_qty,
       avg(l_extendedprice) AS avg_price,
       avg(l_discount) AS avg_disc,
       count(*) AS count_order,
       min(l_shipdate) AS first_ship,
       max(l_shipdate) AS last_ship
FROM lineitem
WHERE l_shipdate <= DATE '1998-09-02'
GROUP BY l_returnflag, l_linestatus
