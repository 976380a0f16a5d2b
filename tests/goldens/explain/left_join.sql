-- title: LEFT JOIN keeps unmatched orders via per-key match counts; WHERE stays above the join
-- sources: orders(o_orderkey, o_custkey, o_totalprice); customer(c_custkey, c_name, c_mktsegment)
CREATE VIEW orders_with_building_customer AS
SELECT o.o_orderkey, c.c_name
FROM orders o LEFT JOIN customer c ON o.o_custkey = c.c_custkey AND c.c_mktsegment = 'BUILDING'
WHERE o.o_totalprice > 1000
