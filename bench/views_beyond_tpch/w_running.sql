CREATE VIEW w_running AS
SELECT l_orderkey, l_linenumber, l_quantity,
       sum(l_quantity) OVER (PARTITION BY l_orderkey ORDER BY l_linenumber
                             ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS running,
       lag(l_extendedprice) OVER (PARTITION BY l_orderkey ORDER BY l_linenumber) AS prev_price
FROM lineitem
